"""The kinds of slots a worker has besides its threads: its event loop, for async
handlers, and its child processes, for handlers declared ``isolation="process"``.

Each kind runs the job types whose handlers are of that kind, in places of its own, so
that a backlog of one kind never starves another. The thread slots are the catch-all:
they run every other job type, including those the worker does not know by name. This
module holds what the claim needs to keep that promise: which job types each kind runs,
how many of its places are held, and which job types to take or leave while one kind
is full (``claim_filter``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .. import registry
from ..exceptions import InvalidWorkerOptionError
from ..registry import JobDefinition
from .execution import LOOP, PROCESS, THREAD, RunningJob


class Pool(Protocol):
    """What the worker asks of a kind's slots (``AsyncSlots``, ``ProcessSlots``)."""

    def submit(self, running: RunningJob) -> None: ...
    def take_unstarted(self) -> list[RunningJob]: ...
    def stop(self) -> None: ...


@dataclass
class SideKind:
    """One kind of slots beside the threads."""

    #: ``LOOP`` or ``PROCESS``.
    name: str
    #: The job types it runs (among those the worker runs).
    job_types: list[str]
    #: How many jobs it runs at once.
    size: int
    #: How many of its jobs the worker holds (running, waiting for a place, abandoned).
    held: int = 0
    #: Its slots, once the worker started them.
    pool: Pool | None = None

    @property
    def room(self) -> int:
        return self.size - self.held


@dataclass
class SideKinds:
    """The worker's side kinds that run at least one of its job types, and the child
    processes when they run every sync job (``pool``)."""

    kinds: list[SideKind] = field(default_factory=list)
    #: ``THREAD``, or ``PROCESS`` when every sync job runs in a child (``pool``): which
    #: kind runs the job types no other kind claims, unknown ones included.
    pool: str = THREAD

    @classmethod
    def find(
        cls,
        job_types: Iterable[str] | None,
        sizes: dict[str, tuple[int, str]],
        pool: str = THREAD,
    ) -> SideKinds:
        """The side kinds of these job types (``None``: every registered one); ``sizes``
        gives each kind's size and the option that sets it. A kind with job types and
        size 0 is refused: the worker would claim jobs it cannot run. With ``pool``
        ``PROCESS``, the child processes run every sync job type."""
        names = list(job_types) if job_types is not None else registry.registered_job_types()
        found: dict[str, list[str]] = {LOOP: [], PROCESS: []}
        for name in names:
            kind = kind_of(registry.find_definition(name), pool)
            if kind != THREAD:
                found[kind].append(name)
        kinds = []
        for name, types in found.items():
            size, option = sizes[name]
            catch_all = name == pool
            if (types or catch_all) and not size:
                raise InvalidWorkerOptionError(option, _refusal(name, types, catch_all))
            if types or catch_all:
                kinds.append(SideKind(name, types, size))
        return cls(kinds, pool)

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def get(self, name: str) -> SideKind | None:
        return next((kind for kind in self.kinds if kind.name == name), None)

    def size(self, name: str) -> int:
        kind = self.get(name)
        return kind.size if kind else 0

    @property
    def total_size(self) -> int:
        return sum(kind.size for kind in self.kinds)

    @property
    def held(self) -> int:
        return sum(kind.held for kind in self.kinds)

    @property
    def room(self) -> int:
        return sum(kind.room for kind in self.kinds)

    def start(self, make: Callable[[SideKind], Pool]) -> None:
        for kind in self.kinds:
            kind.pool = make(kind)

    def stop(self) -> None:
        for kind in self.kinds:
            if kind.pool is not None:
                kind.pool.stop()
                kind.pool = None

    def take_unstarted(self) -> list[RunningJob]:
        taken: list[RunningJob] = []
        for kind in self.kinds:
            if kind.pool is not None:
                taken += kind.pool.take_unstarted()
        return taken

    def claim_filter(
        self, job_types: list[str] | None, thread_room: int
    ) -> tuple[list[str] | None, list[str] | None]:
        """The job types to claim and those to leave (``p_skip_job_types``) while some
        kind has no room: only the kinds with room get jobs. ``thread_room``: the room
        of the threads, the kind that runs every other job type (unless ``pool``)."""
        others = [kind for kind in self.kinds if kind.name != self.pool]
        catch_all = self.get(self.pool)
        room = catch_all.room if catch_all is not None else thread_room
        if not others:
            return job_types, None
        full = [name for kind in others if kind.room <= 0 for name in kind.job_types]
        if room > 0:
            return job_types, full or None
        with_room = [name for kind in others if kind.room > 0 for name in kind.job_types]
        return (with_room or job_types), None

    def let_go(self, running: RunningJob) -> None:
        """Count ``running`` out of its kind's held places (nothing for a thread's)."""
        if running.kind != THREAD:
            side = self.get(running.kind)
            if side is not None:
                side.held -= 1


def kind_of(definition: JobDefinition | None, pool: str = THREAD) -> str:
    """Which kind of slot runs jobs of ``definition``: ``THREAD``, ``LOOP`` or
    ``PROCESS``. An unknown job type runs where ``pool`` says, and fails as unknown."""
    if definition is not None and definition.is_async:
        return LOOP
    if pool == PROCESS or (definition is not None and definition.isolation == "process"):
        return PROCESS
    return THREAD


def _refusal(kind: str, job_types: list[str], catch_all: bool) -> str:
    if catch_all:
        return "must be 1 or more with pool='process' (--pool process): children run every job"
    names = ", ".join(sorted(job_types))
    if kind == LOOP:
        return (
            f"is 0, but job type(s) {names} have async handlers that this worker would "
            "claim and could not run. Give it async slots (--async-concurrency, "
            "PGQUEUE['ASYNC_CONCURRENCY']), or leave those types to other workers with "
            "job_types (--job-types)"
        )
    return (
        f"is 0, but job type(s) {names} run in child processes (isolation='process') that "
        "this worker would claim and could not run. Give it process slots "
        "(--process-concurrency, PGQUEUE['PROCESS_CONCURRENCY']), or leave those types to "
        "other workers with job_types (--job-types)"
    )
