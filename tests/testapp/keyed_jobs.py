"""Job types with per-key limits; registered by the tests of per-key limits only."""

import os

from django_pgqueue import job, registry

from .jobs import _record_execution


@job("tests.per_tenant", concurrency=1, concurrency_key="tenant")
def per_tenant(job):
    """``tests.record``, at most one job of each ``data['tenant']`` claimed or running."""
    _record_execution(job)


# Importing this module (as collecting the tests of per-key limits does) must not declare
# the limit to every test: the fixture registers it again for the tests that want it.
if not os.environ.get("PGQUEUE_TEST_KEYED_JOBS"):
    registry.unregister("tests.per_tenant")
