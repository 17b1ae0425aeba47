"""Settings of a worker process whose spans a test reads (tests/test_tracing.py).

``tests.settings`` with ``PGQUEUE["OPENTELEMETRY"]`` on, and the OpenTelemetry SDK set
up here, as a project would set it up in its settings or its WSGI module: the spans go
to an in-memory exporter, written as JSON when the process exits, to
``PGQUEUE_SPANS_FILE`` followed by ``.`` and the process id (a worker's child processes
set up the same).
"""

import atexit
import json
import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.settings import *  # noqa: F403
from tests.settings import PGQUEUE as _SUITE_PGQUEUE

PGQUEUE = {**_SUITE_PGQUEUE, "OPENTELEMETRY": True}

_exporter = InMemorySpanExporter()
_provider = TracerProvider(resource=Resource.create({"process.pid": os.getpid()}))
_provider.add_span_processor(SimpleSpanProcessor(_exporter))
trace.set_tracer_provider(_provider)


@atexit.register
def _write_spans() -> None:
    spans = [json.loads(span.to_json()) for span in _exporter.get_finished_spans()]
    with open(f"{os.environ['PGQUEUE_SPANS_FILE']}.{os.getpid()}", "w") as file:
        json.dump(spans, file)
