"""Chains, groups and chords: workflows written as steps, enqueued as one graph.

Each form compiles to the specs of one ``enqueue_many`` call whose jobs depend on each
other by index (``workflows.insert``): a chain makes each step depend on every last job
of the step before it, a group puts its members side by side, and a chord is a group
followed by a callback. Forms nest: ``chain(a, group(b, c), d)`` runs ``b`` and ``c``
after ``a``, and ``d`` after both.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Unpack

from .. import conf, tracing
from ..exceptions import InvalidJobError
from ..inserts import collector_paused
from ..jobrows import prepared_rows
from ..options import ENQUEUE_KEYS, EnqueueOptions, Step, check_keys
from ..schema import OnDependencyFailure
from .insert import enqueue_graph, enqueue_ordered_graph

if TYPE_CHECKING:
    from ..models import Job

__all__ = ["Batch", "Chain", "Group", "Workflow", "batch", "chain", "chord", "group"]


@dataclass(frozen=True)
class Workflow:
    """The jobs of an enqueued chain, group or chord.

    Attributes:
        id: The ``workflow_id`` of every job of it.
        jobs: The jobs, one per step, in the order the steps were written (depth first).
    """

    id: uuid.UUID
    jobs: list[Job]

    def cancel(self) -> int:
        """Cancel every job of the workflow not finished yet (see
        [`JobQuerySet.cancel()`][django_pgqueue.models.JobQuerySet.cancel]): waiting and
        pending jobs at once, running ones asked to stop. Returns how many changed."""
        return cancel_workflow(self.id, using=self.jobs[0]._state.db)


def cancel_workflow(workflow_id: uuid.UUID, *, using: str | None = None) -> int:
    """Cancel every job of the workflow ``workflow_id`` that has not finished; see
    [`Workflow.cancel()`][django_pgqueue.workflows.canvas.Workflow.cancel]."""
    jobs = _job_model().objects.using(conf.jobs_database(using))
    return jobs.filter(workflow_id=workflow_id).cancel()


@functools.cache
def _job_model() -> type[Job]:
    # On first use: ``import django_pgqueue`` must work before the app registry is ready.
    from ..models import Job

    return Job


class _Form:
    """What chains and groups share: they can be enqueued, and nest."""

    def enqueue(self, *, using: str | None = None, **options: Unpack[EnqueueOptions]) -> Workflow:
        """Write every step as a job, in one transaction (a savepoint inside yours).

        ``options`` (``queue``, ``priority``, ``on_dependency_failure``, ...) apply to
        every step that does not set them itself. Inside ``transaction.atomic`` the
        workflow exists only if the transaction commits. Raises ``InvalidJobError``,
        naming the step as ``specs[i]`` (steps counted depth first), before anything
        is written.
        """
        if options:
            check_keys(options, ENQUEUE_KEYS, "enqueue()")
            if "depends_on" in options:
                raise TypeError(
                    "enqueue() of a workflow takes no depends_on: give it to its first "
                    "steps (Step(..., depends_on=[...]))"
                )
        alias = conf.jobs_database(using)
        if conf.get_settings().OPENTELEMETRY:
            with tracing.enqueue_span(None, operation="enqueue workflow") as span:
                jobs = self._insert(alias, dict(options), tracing.current_context())
                tracing.describe_enqueued(span, jobs)
        else:
            jobs = self._insert(alias, dict(options), None)
        workflow_id = jobs[0].workflow_id
        assert workflow_id is not None
        return Workflow(workflow_id, jobs)

    def _insert(self, alias: str, options: dict[str, Any], trace_context: str | None) -> list[Job]:
        specs: list[dict[str, Any]] = []
        assert isinstance(self, (Chain, Group, Batch))
        with collector_paused():  # several objects per step, no cycles (inserts.py)
            _compile(self, [], specs, options)
            rows = prepared_rows(specs, trace_context)
            if _internal_only(specs):
                # Compiled in order: every step waits for earlier ones only, so the steps
                # are validated and sent in parts, the server inserting as they come.
                return enqueue_ordered_graph(rows, alias, _field)
            return enqueue_graph(list(rows), alias, _field)


class Chain(_Form):
    """Steps that run one after another; made by [`chain()`][django_pgqueue.chain]."""

    def __init__(self, steps: tuple[Node, ...]) -> None:
        self.steps = steps

    def __repr__(self) -> str:
        return f"chain({', '.join(map(repr, self.steps))})"


class Group(_Form):
    """Steps that run side by side; made by [`group()`][django_pgqueue.group]."""

    def __init__(self, members: tuple[Node, ...]) -> None:
        self.members = members

    def __repr__(self) -> str:
        return f"group({', '.join(map(repr, self.members))})"


#: A step of a workflow: a job, or a chain or group of them.
Node = Step | Chain | Group


class Batch(_Form):
    """Jobs side by side and callbacks once all have finished; made by
    [`batch()`][django_pgqueue.batch]. Not a step of other forms: enqueue it."""

    def __init__(self, members: Group, callbacks: dict[str, Step]) -> None:
        self.members = members
        self.callbacks = callbacks

    def __repr__(self) -> str:
        callbacks = "".join(f", {name}={step!r}" for name, step in self.callbacks.items())
        return f"batch({self.members!r}{callbacks})"


#: The failure policy of each callback of a batch towards the batch's jobs.
_CALLBACK_POLICIES = {
    "on_complete": OnDependencyFailure.RUN.value,
    "on_success": OnDependencyFailure.CANCEL.value,
    "on_failure": OnDependencyFailure.RUN_ONLY.value,
}


def batch(
    members: Node | Iterable[Node],
    *,
    on_complete: Step | None = None,
    on_success: Step | None = None,
    on_failure: Step | None = None,
) -> Batch:
    """Jobs side by side, and callbacks that each run once when every one has finished.

    ```python
    batch(
        (import_row.step({"row": n}) for n in range(rows)),
        on_complete=report.step({"import": pk}),
        on_failure=alert.step({"import": pk}),
    ).enqueue()
    ```

    - ``on_complete`` runs once all have finished, however they ended.
    - ``on_success`` runs only if all completed; otherwise it is cancelled, and its
      ``last_error`` names a job that failed.
    - ``on_failure`` runs only if one failed for good or was cancelled; otherwise it is
      cancelled as not needed.

    A callback reads how the batch ended with
    [`Job.dependency_outcome()`][django_pgqueue.models.Job.dependency_outcome]: how many
    completed, and the ids of those that failed or were cancelled. ``members``: steps,
    chains and groups, or one iterable of them; a chain counts by its last jobs. At
    least one callback. Also ``django_pgqueue.batch``.
    """
    callbacks = {
        name: step
        for name, step in (
            ("on_complete", on_complete),
            ("on_success", on_success),
            ("on_failure", on_failure),
        )
        if step is not None
    }
    for name, step in callbacks.items():
        if not isinstance(step, Step):
            raise TypeError(f"batch() takes a Step as {name}, got {step!r}")
    if not callbacks:
        raise InvalidJobError(
            "on_complete", "a batch needs a callback: on_complete, on_success or on_failure"
        )
    group_of = members if isinstance(members, Group) else group(members)
    return Batch(group_of, callbacks)


def chain(*steps: Node | Iterable[Node]) -> Chain:
    """Steps that run one after another: each starts once the step before it completed.

    ```python
    chain(fetch.step({"url": url}), parse.step(), store.step()).enqueue()
    ```

    A step is a [`Step`][django_pgqueue.Step], or a chain or group; after a group, the
    next step waits for every member of it. A step reads the results of the steps it
    waits for with [`Job.dependency_results()`][django_pgqueue.models.Job.dependency_results].
    Also ``django_pgqueue.chain``. Takes the steps as arguments or one iterable.
    """
    return Chain(_nodes(steps, "chain"))


def group(*members: Node | Iterable[Node]) -> Group:
    """Steps that run side by side (as many at once as workers take).

    ```python
    group(resize.step({"photo": pk}) for pk in photo_ids).enqueue()
    ```

    Also ``django_pgqueue.group``. Takes the members as arguments or one iterable.
    """
    return Group(_nodes(members, "group"))


def chord(header: Node | Iterable[Node], callback: Node) -> Chain:
    """A group, then a callback that runs once, after every member of it completed.

    ```python
    chord(
        (resize.step({"photo": pk}) for pk in photo_ids),
        build_preview.step({"album": album.pk}),
    ).enqueue()
    ```

    ``header``: a group, or steps to make one of. The callback reads the members'
    results, in order, with ``list(job.dependency_results().values())``. Each member's
    completion costs the same however large the group (see
    [Workflow semantics](../explanation/workflows.md)). Also ``django_pgqueue.chord``.
    """
    members = header if isinstance(header, Group) else group(header)
    return Chain((members, *_nodes((callback,), "chord")))


def _nodes(items: tuple[Any, ...], form: str) -> tuple[Node, ...]:
    single = items[0] if len(items) == 1 else None
    if isinstance(single, Iterable) and not isinstance(single, (Step, Chain, Group, str, bytes)):
        items = tuple(single)
    for index, item in enumerate(items):
        if not isinstance(item, (Step, Chain, Group)):
            raise TypeError(
                f"{form}() takes Steps, chains and groups; item {index} is {item!r} "
                "(make a step with Step(job_type, data) or a_job.step(data))"
            )
    if not items:
        raise InvalidJobError("steps", f"{form}() needs at least one step")
    return items


def _compile(
    node: Node | Batch, after: list[int], specs: list[dict[str, Any]], defaults: dict[str, Any]
) -> list[int]:
    """Append ``node``'s specs, its first jobs depending on the specs ``after``; return
    the indexes of its last jobs (those a following step waits for)."""
    if isinstance(node, Step):
        given = node.options.get("depends_on")
        if given is not None and not isinstance(given, (list, tuple)):
            given = [given]
        if any(isinstance(item, int) and not isinstance(item, bool) for item in given or ()):
            raise InvalidJobError(
                f"specs[{len(specs)}].depends_on",
                "a step's depends_on names jobs that exist already, not indexes",
            )
        depends_on = [*after, *(given or ())]
        spec = _spec(node, defaults)
        if depends_on:
            spec["depends_on"] = depends_on
        elif "on_dependency_failure" not in node.options:
            spec.pop("on_dependency_failure", None)  # the workflow's, for steps that wait
        specs.append(spec)
        return [len(specs) - 1]
    if isinstance(node, Batch):
        exits = _compile(node.members, after, specs, defaults)
        for name, callback in node.callbacks.items():
            if callback.options.get("depends_on") is not None:
                raise InvalidJobError(
                    f"specs[{len(specs)}].depends_on",
                    f"the {name} callback of a batch waits for the batch's jobs only",
                )
            policy = _CALLBACK_POLICIES[name]
            specs.append(
                {**_spec(callback, defaults), "depends_on": exits, "on_dependency_failure": policy}
            )
        return []
    if isinstance(node, Chain):
        last = after
        for step in node.steps:
            last = _compile(step, last, specs, defaults)
        return last
    return [index for member in node.members for index in _compile(member, after, specs, defaults)]


def _internal_only(specs: list[dict[str, Any]]) -> bool:
    """Whether the specs depend on each other only, by index (no job of the database)."""
    return all(
        isinstance(item, int) and not isinstance(item, bool)
        for spec in specs
        for item in spec.get("depends_on", ())
    )


def _spec(step: Step, defaults: dict[str, Any]) -> dict[str, Any]:
    """``step`` as a spec of ``enqueue_many``: its own options over the workflow's."""
    return {**defaults, **step.options, "job_type": step.job_type, "data": step.data}


def _field(index: int) -> str:
    return f"specs[{index}].depends_on"
