"""Workflows: jobs that wait for other jobs (``depends_on``).

``plan`` checks a call's dependencies and decides each job's first status; ``insert``
writes the jobs, their edges and counters. From then on the database settles them
(``sql/workflow_settle_v1.sql``), in the transaction that finishes each dependency.
"""
