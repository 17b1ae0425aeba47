"""Signals for users' own hooks around a job's life.

[Django signals](https://docs.djangoproject.com/en/stable/topics/signals/). Every
signal is sent with ``sender=Job`` (the model class) and ``job``, the
[`Job`][django_pgqueue.Job] instance. Receivers take ``**kwargs`` so that later
arguments do not break them.

```python
from django.db import transaction
from django.dispatch import receiver

from django_pgqueue.models import Job
from django_pgqueue.signals import job_enqueued, job_failed


@receiver(job_enqueued, sender=Job)
def audit(sender, job, **kwargs):
    transaction.on_commit(lambda: log_audit("queued", job.pk))


@receiver(job_failed, sender=Job)
def alert(sender, job, error, will_retry, **kwargs):
    if not will_retry:
        notify_on_call(f"{job.job_type} {job.pk} failed: {error}")
```

| Signal | Extra arguments | Sent |
|---|---|---|
| ``job_enqueued`` | | By ``enqueue()`` and ``enqueue_many()``, once for each job they \
inserted, in the order of the specs; not for an existing unique job returned instead, nor \
for a batch rejected with ``DuplicateJobError``. |
| ``job_started`` | | In the worker, in the slot thread about to run the handler (the \
job is ``running``). |
| ``job_completed`` | ``result`` | In the worker, after the handler returned and its \
transaction (with ``atomic=True``) committed; ``result`` is the handler's return value. |
| ``job_failed`` | ``error``, ``exception``, ``will_retry`` | In the worker, after the \
handler raised or timed out: ``error`` is the message recorded on the job \
(``"<ExceptionType>: <message>"``), ``exception`` the exception, ``will_retry`` whether \
the job goes back to ``pending`` for another attempt (``False`` when it ends \
``failed``). Not sent for a job that ends ``cancelled``. |

``job_enqueued`` is sent on the caller's connection, inside the enqueuing transaction,
like Django's ``post_save``: the job exists only if that transaction commits, so do work
that must wait for the commit with
[``transaction.on_commit``](https://docs.djangoproject.com/en/stable/topics/db/transactions/#performing-actions-after-commit)
in the receiver. A receiver's exception propagates to the caller of ``enqueue()``;
inside ``transaction.atomic`` that rolls the enqueue back with the rest of the
transaction (in autocommit mode the job is already committed).

The worker signals are sent robustly: a receiver's exception is logged at ``ERROR`` on
``django_pgqueue.worker`` (message ``signal receiver ... failed for job ...``) and the
job's outcome is recorded regardless. They run on the job's slot thread and delay the
next job of that slot: keep them quick. They are sent only in the worker process that
runs the job, so connect their receivers in code every worker imports (an app's
``ready()`` or its ``jobs`` module).
"""

from __future__ import annotations

from django.dispatch import Signal

job_enqueued = Signal()
job_started = Signal()
job_completed = Signal()
job_failed = Signal()

__all__ = ["job_completed", "job_enqueued", "job_failed", "job_started"]
