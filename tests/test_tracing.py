"""OpenTelemetry (``PGQUEUE["OPENTELEMETRY"]``): a span for each enqueue and each run,
the run continuing the enqueue's trace through the context stored with the job."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.urls import reverse
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_pgqueue import Step, chain, conf, enqueue, enqueue_many, job
from django_pgqueue.exceptions import SettingsError
from django_pgqueue.models import Job, JobStatus
from django_pgqueue.worker import Worker
from tests.testapp import process_jobs
from tests.workers import WorkerProcess, run_until_finished

pytestmark = pytest.mark.django_db(transaction=True)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans(pgqueue_settings) -> Iterator[InMemorySpanExporter]:
    """Tracing on, and the spans of the test recorded in memory."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)  # once per process, as the SDK allows
    pgqueue_settings(OPENTELEMETRY=True)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def tracer() -> trace.Tracer:
    return trace.get_tracer("tests")


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def traceparent(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` of ``span``."""
    ids = span.get_span_context()
    return f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"


def test_enqueue_is_a_producer_span_in_the_callers_trace(spans):
    with tracer().start_as_current_span("POST /orders") as request:
        job_ = enqueue("tests.returns", {"n": 1}, queue="mail")

    (span,) = named(spans, "enqueue tests.returns")
    assert span.kind == SpanKind.PRODUCER
    assert span.parent is not None and span.parent.span_id == request.get_span_context().span_id
    assert span.attributes["pgqueue.job.id"] == str(job_.id)
    assert span.attributes["pgqueue.job.type"] == "tests.returns"
    assert span.attributes["pgqueue.job.queue"] == "mail"
    assert span.attributes["messaging.system"] == "django_pgqueue"


def test_the_job_stores_the_context_of_its_enqueue(spans):
    job_ = enqueue("tests.returns", {"n": 1})

    (span,) = named(spans, "enqueue tests.returns")
    stored = Job.objects.get(pk=job_.id).trace_context
    assert stored == job_.trace_context
    assert stored["traceparent"] == traceparent(span)


def test_without_the_setting_nothing_is_traced_or_stored(spans, pgqueue_settings):
    pgqueue_settings(OPENTELEMETRY=False)
    with tracer().start_as_current_span("POST /orders"):
        job_ = enqueue("tests.returns", {"n": 1})
        Worker(burst=True).run()

    assert [span.name for span in spans.get_finished_spans()] == ["POST /orders"]
    assert Job.objects.get(pk=job_.id).trace_context is None


def test_a_run_is_a_consumer_span_continuing_the_trace_of_its_enqueue(spans):
    job_ = enqueue("tests.returns", {"n": 2})
    Worker(burst=True).run()

    (enqueued,) = named(spans, "enqueue tests.returns")
    (run,) = named(spans, "run tests.returns")
    assert run.kind == SpanKind.CONSUMER
    assert run.context.trace_id == enqueued.context.trace_id
    assert run.parent is not None and run.parent.span_id == enqueued.context.span_id
    assert [link.context.span_id for link in run.links] == [enqueued.context.span_id]
    assert run.attributes["pgqueue.job.id"] == str(job_.id)
    assert run.attributes["pgqueue.job.attempt"] == 1
    assert run.attributes["pgqueue.job.outcome"] == "completed"
    assert run.status.status_code == StatusCode.UNSET


def test_every_attempt_has_a_span_in_the_enqueues_trace_with_its_outcome(spans):
    failing = enqueue("tests.fail", max_attempts=2)

    assert run_until_finished(failing).status == JobStatus.FAILED
    (enqueued,) = named(spans, "enqueue tests.fail")
    runs = sorted(named(spans, "run tests.fail"), key=lambda span: span.start_time or 0)
    assert [run.attributes["pgqueue.job.attempt"] for run in runs] == [1, 2]
    assert [run.attributes["pgqueue.job.outcome"] for run in runs] == ["retried", "failed"]
    for attempt, run in enumerate(runs, start=1):
        assert run.parent is not None and run.parent.span_id == enqueued.context.span_id
        assert run.status.status_code == StatusCode.ERROR
        assert run.status.description == f"RuntimeError: boom on attempt {attempt}"
        (event,) = run.events
        assert event.name == "exception"
        assert event.attributes["exception.message"] == f"boom on attempt {attempt}"


def test_a_job_failed_on_purpose_and_a_snooze_say_so(spans):
    enqueue("tests.fail_now")
    run_until_finished(enqueue("tests.snooze", {"times": 1, "delay": 0}))

    (failed,) = named(spans, "run tests.fail_now")
    assert failed.attributes["pgqueue.job.outcome"] == "failed"
    snoozed, ran = sorted(named(spans, "run tests.snooze"), key=lambda span: span.start_time or 0)
    assert snoozed.attributes["pgqueue.job.outcome"] == "snoozed"
    assert snoozed.status.status_code == StatusCode.UNSET
    assert ran.attributes["pgqueue.job.outcome"] == "completed"


def test_the_handlers_own_spans_and_the_enqueues_baggage_are_inside_the_run(spans, clean_registry):
    seen = {}

    @job("tests.traced")
    def traced(job_):
        seen["tenant"] = baggage.get_baggage("tenant")
        with tracer().start_as_current_span("call the gateway"):
            pass

    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        enqueue("tests.traced")
    finally:
        context.detach(token)
    Worker(burst=True).run()

    (run,) = named(spans, "run tests.traced")
    (inner,) = named(spans, "call the gateway")
    assert inner.parent is not None and inner.parent.span_id == run.context.span_id
    assert seen == {"tenant": "acme"}


def test_an_async_run_has_its_span_current_in_the_handler(spans, clean_registry):
    @job("tests.traced_async")
    async def traced_async(job_):
        await asyncio.sleep(0)
        with tracer().start_as_current_span("awaited call"):
            await asyncio.sleep(0)

    enqueue("tests.traced_async")
    Worker(burst=True).run()

    (run,) = named(spans, "run tests.traced_async")
    (inner,) = named(spans, "awaited call")
    assert run.attributes["pgqueue.job.outcome"] == "completed"
    assert inner.parent is not None and inner.parent.span_id == run.context.span_id


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({}, id="plain, by COPY"),
        pytest.param({"unique_key": "k"}, id="with unique keys"),
        pytest.param({"delay": 0.001}, id="delayed"),
    ],
)
def test_enqueue_many_is_one_span_whose_context_each_job_stores(spans, spec):
    jobs = enqueue_many([{"job_type": "tests.returns", "data": {"n": n}, **spec} for n in range(3)])

    (span,) = named(spans, "enqueue_many")
    assert span.kind == SpanKind.PRODUCER
    assert span.attributes["pgqueue.job.count"] == 3
    ids = [job_.id for job_ in jobs]
    stored = {job_.trace_context["traceparent"] for job_ in Job.objects.filter(pk__in=ids)}
    assert stored == {traceparent(span)}


def test_a_workflows_steps_continue_the_trace_of_its_enqueue(spans):
    chain(Step("tests.returns", {"n": 1}), Step("tests.returns", {"n": 2})).enqueue()
    Worker(burst=True).run()

    (enqueued,) = named(spans, "enqueue workflow")
    runs = named(spans, "run tests.returns")
    assert len(runs) == 2
    assert {run.parent.span_id for run in runs if run.parent} == {enqueued.context.span_id}


def spans_of_worker_processes(tmp_path: Path, **env: str) -> list[dict]:
    """Run a real burst ``pgqueue_worker`` with ``tests.otel_settings``; return the spans
    that it and its child processes recorded, as JSON."""
    worker = WorkerProcess(
        "--burst",
        env={
            "DJANGO_SETTINGS_MODULE": "tests.otel_settings",
            "PGQUEUE_SPANS_FILE": str(tmp_path / "spans"),
            **env,
        },
    )
    try:
        assert worker.wait(timeout=60) == 0, worker.output()
    finally:
        worker.stop()
    return [span for path in tmp_path.glob("spans.*") for span in json.loads(path.read_text())]


def test_a_real_worker_process_continues_the_trace_of_the_test(spans, tmp_path: Path):
    with tracer().start_as_current_span("POST /orders") as request:
        job_ = enqueue("tests.returns", {"n": 3})

    (run,) = spans_of_worker_processes(tmp_path)

    (enqueued,) = named(spans, "enqueue tests.returns")
    assert run["name"] == "run tests.returns"
    assert run["kind"] == "SpanKind.CONSUMER"
    assert run["context"]["trace_id"] == f"0x{request.get_span_context().trace_id:032x}"
    assert run["parent_id"] == f"0x{enqueued.context.span_id:016x}"
    assert run["attributes"]["pgqueue.job.id"] == str(job_.id)
    assert run["attributes"]["pgqueue.job.outcome"] == "completed"


def test_a_process_isolated_run_is_traced_in_its_child_process(
    spans, tmp_path: Path, clean_registry, monkeypatch
):
    monkeypatch.setenv("PGQUEUE_TEST_PROCESS_JOBS", "1")
    process_jobs.register()
    job_ = enqueue("tests.process.pid")

    (run,) = spans_of_worker_processes(tmp_path)

    (enqueued,) = named(spans, "enqueue tests.process.pid")
    job_.refresh_from_db()
    assert run["parent_id"] == f"0x{enqueued.context.span_id:016x}"
    assert run["attributes"]["pgqueue.job.outcome"] == "completed"
    # Made in the child that ran the handler, whose process id the job returned.
    assert run["resource"]["attributes"]["process.pid"] == job_.result


def test_the_setting_must_be_true_or_false(pgqueue_settings):
    pgqueue_settings(OPENTELEMETRY="yes")
    with pytest.raises(SettingsError, match=r"PGQUEUE\['OPENTELEMETRY'\] must be True or False"):
        conf.get_settings()


def test_the_setting_asks_for_the_extra_when_opentelemetry_is_missing(
    pgqueue_settings, monkeypatch
):
    real_find_spec = conf.importlib.util.find_spec
    monkeypatch.setattr(
        conf.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "opentelemetry" else real_find_spec(name, *args),
    )
    pgqueue_settings(OPENTELEMETRY=True)
    with pytest.raises(SettingsError, match=r"pip install 'django-pgqueue\[otel\]'"):
        conf.get_settings()


def test_the_admin_shows_the_trace_a_job_was_enqueued_in(spans, admin_client):
    job_ = enqueue("tests.returns", {"n": 4})
    (span,) = named(spans, "enqueue tests.returns")
    untraced = Job.objects.create(job_type="tests.returns")

    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job_.pk]))
    other = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[untraced.pk]))

    ids = span.get_span_context()
    assert (
        f"<code>{ids.trace_id:032x}</code> (enqueued in span <code>{ids.span_id:016x}</code>)"
        in page.content.decode()
    )
    assert "enqueued in span" not in other.content.decode()
