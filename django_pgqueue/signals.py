"""Signals for users' own hooks around a job's life.

Every signal is sent with ``sender=Job`` (the model class) and ``job``, the ``Job``
instance. Receivers take ``**kwargs`` so that later arguments do not break them.

- ``job_enqueued(job)``: for each job ``enqueue``/``enqueue_many`` inserted (not for an
  existing unique job returned instead), in the enqueuing transaction, like
  ``post_save``: use ``transaction.on_commit`` in the receiver for work that must wait
  for the commit. A receiver's exception propagates to the caller.
- ``job_started(job)``: in the worker, in the thread about to run the handler.
- ``job_completed(job, result)``: in the worker, after the handler returned (and its
  transaction committed); ``result`` is the handler's return value.
- ``job_failed(job, error, exception, will_retry)``: in the worker, after the handler
  raised (or timed out). ``error`` is the message recorded on the job, ``exception`` the
  exception, ``will_retry`` whether the job goes back to pending for another attempt.

Worker signals are sent robustly: a receiver's exception is logged and the job's outcome
is recorded regardless. Receivers in the worker run on the job's slot thread, so they
delay the next job of that slot: keep them quick.
"""

from __future__ import annotations

from django.dispatch import Signal

job_enqueued = Signal()
job_started = Signal()
job_completed = Signal()
job_failed = Signal()

__all__ = ["job_completed", "job_enqueued", "job_failed", "job_started"]
