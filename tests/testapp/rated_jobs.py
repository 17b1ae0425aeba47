"""A job type with a per-key rate; registered by the tests of rate limits only."""

import os

from django_pgqueue import job, registry

from .jobs import _record_execution


@job("tests.per_tenant_rate", rate_limit="5/s", rate_key="tenant")
def per_tenant_rate(job):
    """``tests.record``, at most 5 jobs of each ``data['tenant']`` started in any second."""
    _record_execution(job)


# Importing this module must not declare the rate to every test: the fixture registers
# it again for the tests that want it (and worker processes, through the environment).
if not os.environ.get("PGQUEUE_TEST_RATED_JOBS"):
    registry.unregister("tests.per_tenant_rate")
