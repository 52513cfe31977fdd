"""Who owns a request's run directory: this process, or another one it shares the run with.

Exactly one process owns a run directory (:class:`OwnRun`): it claims it (a
new run, the newest unfinished one to resume, or a new one that ``carry_over``
copies results into), opens it before any task runs, and writes how it
ended. In process that is the process running the tasks. Under pytest-xdist
it is the controller, which runs no task, and the workers share the run
(:class:`SharedRun`): each runs the tasks handed to it, takes a task whose
usable detail the owner already put on disk for done, and leaves opening
and finishing the run to the owner.

A request's runtime (``request.RequestRuntime``) asks its role at
each of those four points; nothing else tells the two apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from ..vocabulary.errors import AgentCompassError
from ..vocabulary.types import RequestState, RunStatus, TaskSpec
from .context import RequestContext
from .store import (
    RunStore,
    claim_run_dir,
    copy_details,
    find_carry_over_source,
    find_resumable_run,
    killed_runs,
    now,
    record_killed,
    release_run_dir,
)
from .store.details import DetailFiles
from .task import TaskOutcome, outcome_from_detail

__all__ = ["OwnRun", "RequestView", "RunRole", "SharedRun", "claim", "join"]


class RequestView(Protocol):
    """What a role reads and reports of its request (``request.RequestRuntime``)."""

    name: str
    ctx: RequestContext
    tasks: list[TaskSpec]
    wanted: set[str]
    config_dump: dict[str, Any]
    outcomes: dict[str, TaskOutcome]

    @property
    def notes(self) -> list[str]: ...

    @property
    def store(self) -> RunStore: ...

    def reruns(self, task_id: str) -> bool:
        """``task_id`` runs even if a usable detail exists (``--lf``)."""
        ...

    def counts(self) -> dict[str, int]: ...

    def note(self, text: str) -> None:
        """A line for the request's summary."""
        ...

    async def write_summary(self, status: RequestState) -> None:
        """Aggregate the metrics and write ``summary.json``."""
        ...

    def unwritten_file(self, name: str, exc: Exception) -> None:
        """``name`` could not be written in the run directory: said in the summary, and the session fails."""
        ...


class RunRole(Protocol):
    """How this process takes part in a request's run (see the module doc)."""

    #: The run directory continues an interrupted run of the same request.
    resumed: bool

    async def open_run(self, request: RequestView) -> dict[str, TaskOutcome] | None:
        """Make the run directory ready for the request's tasks.

        Returns the usable recorded outcome of each task that has one (resumed
        or carried over), or ``None`` when this process opens nothing and its
        tasks are handed to it one by one (:meth:`recorded` checks each).
        """
        ...

    async def sweep(self, request: RequestView) -> None:
        """Remove what killed runs of the request left behind (the owner), or nothing (a sharer).

        Called for every request of the session before any of them starts a task:
        requests resumed together share their run id, so a later one's sweep
        would otherwise remove the containers an earlier one runs now.
        """
        ...

    def recorded(self, request: RequestView, task: TaskSpec) -> TaskOutcome | None:
        """The usable recorded outcome of ``task``, handed over to run here, if the owner put one on disk."""
        ...

    async def finalize(self, request: RequestView, status: RequestState) -> None:
        """Write the summary and how the run ended (the owner), or nothing (a sharer)."""
        ...

    def end(self, request: RequestView, status: RequestState, **extra: Any) -> None:
        """Write how a run that did not complete ended and give it back (the owner), or nothing (a sharer)."""
        ...


def claim(
    request_dir: Path,
    run_id: str,
    name: str,
    fingerprint: str,
    *,
    resume: bool,
    new_run: bool,
    carry_over: str | None,
) -> tuple[OwnRun, Path]:
    """Claim the run directory this process will own: resumed, carried over into, or new.

    :param resume: Continue the newest unfinished run with the same settings, if there is one.
    :raises AgentCompassError: when ``carry_over`` names nothing usable or a live process holds the run.
    """
    resumable = None
    if resume and not carry_over and not new_run:
        resumable = find_resumable_run(request_dir, fingerprint)
    run_dir = resumable or request_dir / run_id
    _claim(run_dir, name, fingerprint, shared=False)
    source = find_carry_over_source(request_dir, carry_over, current=run_dir) if carry_over else None
    return OwnRun(resumed=resumable is not None, carry_over_from=source), run_dir


def join(run_dir: Path, name: str, fingerprint: str) -> SharedRun:
    """Join a run another process owns (and may not have made yet: its name is agreed on)."""
    _claim(run_dir, name, fingerprint, shared=True)
    return SharedRun()


def _claim(run_dir: Path, name: str, fingerprint: str, *, shared: bool) -> None:
    try:
        claim_run_dir(run_dir, name, fingerprint, shared=shared)
    except OSError as exc:  # output_dir is a file, read-only, or full
        raise AgentCompassError(
            f"cannot write the run directory {run_dir}: {exc.strerror or exc} (check output_dir in the config)"
        ) from None


@dataclass
class OwnRun:
    """This process owns the run directory.

    :param carry_over_from: An earlier run whose compatible results are copied in (``carry_over``).
    """

    resumed: bool = False
    carry_over_from: Path | None = None
    #: Whether :meth:`sweep` ran, and what it failed with (raised when the run is opened, so it is recorded).
    _swept: bool = field(default=False, init=False, repr=False)
    _unswept: Exception | None = field(default=None, init=False, repr=False)

    async def sweep(self, request: RequestView) -> None:
        if self._swept:
            return
        self._swept = True
        store, ctx = request.store, request.ctx
        try:
            # Every killed run of the request, not only the one resumed: another
            # run may have completed since, and the killed one is never resumed.
            for run_id in killed_runs(store.run_dir, include_current=self.resumed):
                swept = await ctx.provider.sweep(run_id)
                if swept:
                    request.note(f"removed {swept} environment(s) or process(es) left behind by run {run_id}")
                if run_id != store.run_dir.name:  # swept once: later runs leave it alone
                    reason = f"its process was killed; run {ctx.run_id} removed what it left behind"
                    record_killed(store.run_dir.parent / run_id, reason)
        except Exception as exc:  # raised by open_run, after run_info.json says the run started
            self._unswept = exc

    async def open_run(self, request: RequestView) -> dict[str, TaskOutcome]:
        """Write ``run_info.json``, sweep what killed runs left (unless :meth:`sweep` did), copy carried-over
        details in; the recorded outcomes."""
        store = request.store
        ctx = request.ctx
        info = store.read_run_info() if self.resumed else {}
        info.update(
            run_id=ctx.run_id,
            request=request.name,
            status=RequestState.RUNNING,
            started_at=info.get("started_at", now()),
            resumed_at=[*info.get("resumed_at", []), now()] if self.resumed else [],
            pid=os.getpid(),
            fingerprint=ctx.fingerprint,
            config=request.config_dump,
            tasks_selected=len(request.tasks),
            tasks_wanted=len(request.wanted),
            carried_over_from=str(self.carry_over_from) if self.carry_over_from else None,
        )
        info.pop("reused_from", None)  # its name in runs made by 0.1 (resumed here)
        store.write_run_info(info)
        if self.resumed:
            store.remove_stale_temp_files()
        await self.sweep(request)
        if self._unswept is not None:
            raise self._unswept
        # What the interrupted run already finished, told apart from what ``carry_over`` copies in.
        own = set(store.detail_ids()) if self.resumed else set()
        wanted = request.ctx.req.execution.details_layout
        if self.resumed and own and store.layout != wanted:
            request.note(
                f"execution.details_layout: this run keeps its details as {store.layout}, the layout it began "
                f"with; {wanted} applies to the next new run"
            )
        if self.carry_over_from is not None:
            self._carry_over(request, self.carry_over_from)
        return self._load_recorded(request, own)

    @staticmethod
    def _carry_over(request: RequestView, source: Path) -> None:
        """Copy compatible, non-error details of ``source`` into this run."""
        by_id = {t.task_id: t for t in request.tasks}

        def wanted(task_id: str) -> bool:
            return task_id in by_id and not request.reruns(task_id)

        def keep(task_id: str, detail: Any) -> bool:
            return (
                detail.get("fingerprint") == request.ctx.task_fingerprint(by_id[task_id])
                and not RunStatus(detail.get("status", RunStatus.COMPLETED)).is_error
            )

        copied, skipped = copy_details(source, request.store, wanted, keep)
        request.note(f"carried over {copied} task(s) from {source}")
        if skipped:
            request.note(f"{skipped} detail(s) in {source} not carried over (errors or a changed config/task)")

    @staticmethod
    def _load_recorded(request: RequestView, own: set[str]) -> dict[str, TaskOutcome]:
        out: dict[str, TaskOutcome] = {}
        by_id = {t.task_id: t for t in request.tasks}
        ignored = 0
        store = request.store
        for detail in store.iter_details():
            task = by_id.get(str(detail.get("task_id")))
            if task is None or request.reruns(task.task_id):
                continue
            if detail.get("fingerprint") != request.ctx.task_fingerprint(task):
                ignored += 1
                continue
            path = store.detail_file(task.task_id)
            out[task.task_id] = outcome_from_detail(request.name, task, detail, path, resumed=task.task_id in own)
        if ignored:
            request.note(f"ignored {ignored} recorded detail(s) made with a different config")
        return out

    def recorded(self, request: RequestView, task: TaskSpec) -> TaskOutcome | None:
        return None  # what was recorded was taken when the run was opened

    async def finalize(self, request: RequestView, status: RequestState) -> None:
        await request.write_summary(status)
        self.end(request, status)

    def end(self, request: RequestView, status: RequestState, **extra: Any) -> None:
        store = request.store
        kept = [e for o in request.outcomes.values() if not (o.carried_over or o.resumed) for e in o.kept_environments]
        try:
            store.compact_details()  # a journal: one line per task, what a kill cut short gone
        except OSError as exc:  # left as written: every reader reads it as before
            request.note(f"details/journal.jsonl left as written: compacting it failed: {exc}")
        store.close()
        try:
            store.update_run_info(
                status=status,
                finished_at=now(),
                counts=request.counts(),
                notes=request.notes,
                kept_environments=kept,
                with_plans=True,
                **extra,
            )
        except (OSError, ValueError) as exc:  # a full disk must not also keep the lock
            request.unwritten_file("run_info.json", exc)
        finally:
            release_run_dir(store.run_dir)


@dataclass
class SharedRun:
    """Another process owns the run directory; this one runs the tasks handed to it."""

    resumed: bool = field(default=False, init=False)
    #: The owner's ``carry_over`` source, read once from ``run_info.json`` (False: none).
    _source: DetailFiles | Literal[False] | None = field(default=None, init=False, repr=False)

    async def sweep(self, request: RequestView) -> None:
        return None  # the owner swept before it opened the run

    async def open_run(self, request: RequestView) -> None:
        return None  # the owner opened the run before it handed out a task

    def recorded(self, request: RequestView, task: TaskSpec) -> TaskOutcome | None:
        """A detail made with other settings, or of a task ``--lf`` reruns, does not count."""
        if request.reruns(task.task_id):
            return None
        store = request.store
        detail = store.read_detail(task.task_id)  # none yet (the common case), or cut short by a kill
        if detail is None or detail.get("fingerprint") != request.ctx.task_fingerprint(task):
            return None
        carried = self._carried_over(request, task.task_id)
        return outcome_from_detail(request.name, task, detail, store.detail_file(task.task_id), resumed=not carried)

    def _carried_over(self, request: RequestView, task_id: str) -> bool:
        """Whether the owner copied the detail of ``task_id`` from a ``carry_over`` source (else this run made it).

        The owner names the source in ``run_info.json``; a copy is byte for byte.
        """
        if self._source is None:
            info = request.store.read_run_info()
            source = info.get("carried_over_from") or info.get("reused_from")  # its name in runs made by 0.1
            self._source = DetailFiles(Path(source)) if source else False
        if self._source is False:
            return False
        return request.store.same_detail(self._source, task_id)

    async def finalize(self, request: RequestView, status: RequestState) -> None:
        return None  # the owner finalizes the run from the details every process wrote

    def end(self, request: RequestView, status: RequestState, **extra: Any) -> None:
        return None  # the owner records how the run ended
