"""The body of a child process that runs process-isolated handlers, one job at a time.

Started by ``ProcessSlots`` with multiprocessing's ``spawn`` (never ``fork``: the worker
has threads, and a forked child would inherit their locks mid-use). It sets Django up,
says it is ready, then runs each job it is sent and sends back the outcome, until it is
told to stop, its parent goes away, or its parent kills it.

Signals: the child ignores ``SIGINT`` and ``SIGTERM``, which a terminal or a service
manager sends to every process of the worker at once: the worker's own shutdown decides
when its children stop. ``SIGUSR1`` is the worker asking it to exit at once (a timeout,
a cancellation); ``SIGKILL`` follows when it does not. On Linux the child also dies
with its parent (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

#: What the child sends once Django is set up.
READY = "ready"
#: What the worker sends to let a child exit.
STOP = None


def serve(
    conn: Connection,
    database_settings: dict[str, dict[str, Any]],
    alias: str,
    parent_pid: int,
) -> None:
    """Set up, then run the jobs sent on ``conn`` (the entry point of a child)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, _exit_now)
    _die_with_parent(parent_pid)
    import django

    django.setup()
    from django.db import connections

    # The worker's database settings as they are now (a test runner, for one, changes
    # NAME at run time): the child must write to the database its parent claims from.
    for name, settings_dict in database_settings.items():
        connections[name].settings_dict.update(settings_dict)
    # Imported once Django is set up: they import the models.
    from .. import registry
    from .execution import RunningJob, execute

    conn.send(READY)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the worker is gone
            return
        if message is STOP:
            return
        job, buffered = message
        running = RunningJob(
            job=job, definition=registry.find_definition(job.job_type), buffered=buffered
        )
        outcome = execute(running, alias)
        if _exiting:
            # Asked to exit mid-job (SIGUSR1): the handler has unwound (its finally
            # blocks ran, its transaction rolled back); its outcome is the worker's.
            connections.close_all()
            sys.exit(128 + signal.SIGUSR1)
        outcome.exception = None  # its text is in outcome.traceback; it may not pickle
        conn.send((outcome, running.duration, _peak_memory()))


#: Set once the worker asked this child to exit.
_exiting = False


def _exit_now(signum: int, frame: Any) -> None:
    global _exiting
    _exiting = True
    # Unwinds the handler, running its finally blocks (execute() catches it, as any
    # exception of a handler, and the loop above then exits).
    sys.exit(128 + signum)


def _peak_memory() -> int:
    """The most memory this process has held, in bytes.

    On Linux, ``VmHWM`` of /proc/self/status: the peak of this process's own memory
    since it started. ``ru_maxrss`` would not do there: Linux keeps it across the
    ``execve`` that spawned this interpreter, so it starts at the worker's own peak.
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
