"""Job types with per-key limits; registered by the tests of per-key limits only."""

from django_pgqueue import job

from .jobs import _record_execution


@job("tests.per_tenant", concurrency=1, concurrency_key="tenant")
def per_tenant(job):
    """``tests.record``, at most one job of each ``data['tenant']`` claimed or running."""
    _record_execution(job)
