"""OpenTelemetry spans of enqueues and runs (``PGQUEUE["OPENTELEMETRY"]``).

Only ``opentelemetry-api`` is used, imported on first use: the project configures the
SDK (its tracer provider, exporters and propagators) as for the rest of its code. The
callers check the setting; with it off, nothing here runs.

- An enqueue is a ``PRODUCER`` span, ``enqueue <job type>`` (``enqueue_many`` for a
  batch). The context current inside it, as the global propagator writes it (W3C
  ``traceparent``, plus ``tracestate`` and baggage when there are some), is stored with
  each job it inserts, in ``Job.trace_context``.
- Each run of a job (every attempt) is a ``CONSUMER`` span, ``run <job type>``, the
  child of that stored context and linked to it: a request, the jobs it enqueued and
  all their attempts read as one trace. The span is current while the handler runs, so
  the handler's own spans (HTTP clients, database instrumentation) nest under it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

#: The instrumentation scope of the spans.
TRACER_NAME = "django_pgqueue"
#: ``messaging.system`` of every span.
SYSTEM = "django_pgqueue"

#: The attributes of a job, on each span about one.
JOB_ID = "pgqueue.job.id"
JOB_TYPE = "pgqueue.job.type"
JOB_QUEUE = "pgqueue.job.queue"
JOB_ATTEMPT = "pgqueue.job.attempt"
#: How a run ended: ``completed``, ``retried``, ``failed``, ``cancelled``, ``snoozed``,
#: ``suspended`` (a sleep or a wait for an event)
#: or ``handed_back`` (given back unstarted).
JOB_OUTCOME = "pgqueue.job.outcome"
#: On an ``enqueue_many`` span: how many jobs the call returned.
JOB_COUNT = "pgqueue.job.count"


@functools.cache
def _tracer() -> Tracer:
    from opentelemetry import trace

    try:
        version: str | None = importlib.metadata.version("django-pgqueue")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout
        version = None
    # A proxy until the project sets its provider, and then that provider's tracer.
    return trace.get_tracer(TRACER_NAME, version)


@contextlib.contextmanager
def enqueue_span(
    job_type: Any, queue: Any = None, *, operation: str = "enqueue_many"
) -> Iterator[Span]:
    """A span around one ``enqueue()`` (``job_type``: a string), or one call of
    ``operation`` that inserts several jobs (``None``); an error raised inside is
    recorded on it."""
    from opentelemetry.trace import SpanKind

    attributes: dict[str, str] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
    }
    if isinstance(job_type, str):
        name = f"enqueue {job_type}"
        attributes[JOB_TYPE] = job_type
    else:
        name = operation
    if isinstance(queue, str):
        attributes["messaging.destination.name"] = attributes[JOB_QUEUE] = queue
    tracer = _tracer()
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        yield span


def describe_enqueued(span: Span, jobs: list[Any]) -> None:
    """Name on ``span`` what an enqueue returned: the job, or how many."""
    if len(jobs) == 1:
        job = jobs[0]
        span.set_attributes(
            {
                JOB_ID: str(job.id),
                JOB_TYPE: job.job_type,
                JOB_QUEUE: job.queue,
                "messaging.message.id": str(job.id),
                "messaging.destination.name": job.queue,
            }
        )
    if jobs:
        span.set_attribute(JOB_COUNT, len(jobs))


def current_context() -> str | None:
    """The current trace context as JSON, to store with a job; ``None`` outside any
    trace (the propagator writes nothing)."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, separators=(",", ":")) if carrier else None


@contextlib.contextmanager
def run_span(job: Any) -> Iterator[Span]:
    """The span of one run of ``job``, current inside the block: the child of the
    context stored with the job, and linked to it."""
    from opentelemetry import context, propagate, trace
    from opentelemetry.trace import Link, SpanKind

    stored = job.trace_context
    parent = propagate.extract(stored) if isinstance(stored, Mapping) else None
    links = []
    if parent is not None:
        enqueued = trace.get_current_span(parent).get_span_context()
        if enqueued.is_valid:
            links.append(Link(enqueued))
    job_id = str(job.id)
    attributes: dict[str, str | int] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": job_id,
        JOB_ID: job_id,
        JOB_TYPE: job.job_type,
        JOB_QUEUE: job.queue,
        JOB_ATTEMPT: job.attempts,
    }
    # Attached, not only the parent: the stored baggage is the handler's too.
    token = context.attach(parent) if parent is not None else None
    try:
        with _tracer().start_as_current_span(
            f"run {job.job_type}",
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            # The worker decides what an exception means (a retry, a snooze, a failure).
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span
    finally:
        if token is not None:
            context.detach(token)


def stored_ids(trace_context: Any) -> tuple[str, str] | None:
    """The trace id and the enqueue's span id in a job's ``trace_context``, as hex (what
    a tracing backend searches by); ``None`` without a W3C ``traceparent``."""
    parent = trace_context.get("traceparent") if isinstance(trace_context, Mapping) else None
    parts = parent.split("-") if isinstance(parent, str) else []
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    return parts[1], parts[2]


def end_run(span: Span, outcome: str, error: str | None, exception: BaseException | None) -> None:
    """Record how a run ended on its span: its outcome, and for a failed attempt
    (``retried`` or ``failed``) the error status and the exception."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute(JOB_OUTCOME, outcome)
    if outcome not in ("retried", "failed"):
        return
    if exception is not None:
        span.record_exception(exception)
    span.set_status(Status(StatusCode.ERROR, error))
