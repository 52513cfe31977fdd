"""One request's life in a run, and the one owner of its state.

A request is checked (preflight), has its run opened, has its tasks run and recorded,
and is finalized, or ended early (failed, stopped, timed out, interrupted).
Every change of its state is a method here, whoever drives it: the
Orchestrator, in process or on an xdist worker, and the xdist controller,
which finalizes from the details the workers wrote. How this process takes
part in the run (it owns the run directory, or shares it) is the request's
role (:mod:`.ownership`), chosen once when the runtime is built.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..vocabulary.errors import AgentCompassError, PreflightError
from ..vocabulary.types import OrchestrationStatus, RequestState, RunResult, RunStatus, TaskSpec, to_jsonable
from .context import RequestContext
from .logs import capture_task_logs
from .ownership import OwnRun, RunRole
from .planner import BenchmarkPlanError
from .store import RunStore, release_run_dir
from .summary import RequestSummary, aggregate, count_outcomes, flagged_tasks, summary_record
from .task import TaskOutcome, outcome_from_detail, run_attempts
from .user_code import call_user

__all__ = ["RequestRuntime"]

log = logging.getLogger("pytest_agentcompass")

#: Why a request ran nothing, as each of its tasks says it ("not run: request 'r' <how>").
FAILED_PREFLIGHT = "failed its preflight"
NOT_OPENED = "could not be prepared"  # its run could not be opened (the words users know)
INTERRUPTED_BY_USER = "interrupted by the user"


class RequestRuntime:
    """Everything one process tracks of one request, changed only through its methods.

    :param tasks: The tasks the benchmark selected, in order.
    :param wanted: Ids of the tasks pytest will run (after ``-k``/``-m``/``--lf``). A
        runtime that shares its run starts with none: each task handed to it is added.
    :param role: How this process takes part in the run (default: it owns it).
    :param rerun_selected: The tasks pytest selected run even if a usable detail exists (``--lf``).
    :param order: Dispatch position of each wanted id (pytest's item order).
    """

    def __init__(
        self,
        ctx: RequestContext,
        tasks: Sequence[TaskSpec],
        wanted: set[str],
        *,
        config_dump: dict[str, Any],
        role: RunRole | None = None,
        rerun_selected: bool = False,
        order: dict[str, int] | None = None,
    ) -> None:
        self.ctx = ctx
        self.role: RunRole = role if role is not None else OwnRun()
        self.name = ctx.req.name
        self.tasks = list(tasks)
        self.wanted = wanted
        self.rerun_selected = rerun_selected
        self.order = order or {}
        self.config_dump = config_dump
        self.pending: deque[TaskSpec] = deque()
        self.active: dict[str, TaskSpec] = {}
        self.outcomes: dict[str, TaskOutcome] = {}
        self.opened = False
        self.finalized = False
        #: Why the request ran nothing (its preflight failed, or its run could not be opened), said once in the summary.
        self.failed: str | None = None
        #: How it failed, as each of its tasks says it (``FAILED_PREFLIGHT``, ``NOT_OPENED``).
        self.failed_how = FAILED_PREFLIGHT
        self.failed_status = RunStatus.INFERENCE_ERROR  # the status of the tasks of a failed request
        self.metrics: dict[str, Any] | None = None
        #: Token totals over the tasks' ``usage`` records (model-calling harnesses), set by :meth:`finalize`.
        self.usage: dict[str, Any] | None = None
        #: ``summary.json`` as :meth:`finalize` wrote it (the run's owner only).
        self.summary: dict[str, Any] | None = None
        self.notes: list[str] = []
        #: What failed while the request's shared resources closed (see :meth:`aclose`).
        self.closing_notes: list[str] = []
        #: Run-directory files that could not be written at the end (see :meth:`unwritten_file`).
        self.unwritten: list[str] = []
        #: Tasks the resumed run had already finished, of all the request's and of the
        #: wanted ones (``-k``, ``--lf``; set by :meth:`open_run`).
        self.resumed_total = 0
        self.resumed_done = 0
        #: Resources of the request as a whole (a model gateway, say), entered on the loop
        #: that runs its tasks: :meth:`aclose` closes them after the harness and the provider.
        self.resources = contextlib.AsyncExitStack()

    @property
    def store(self) -> RunStore:
        return self.ctx.store

    @property
    def resumed(self) -> bool:
        """The run directory continues an interrupted run of this request."""
        return self.role.resumed

    @property
    def drained(self) -> bool:
        return not self.pending and not self.active

    def reruns(self, task_id: str) -> bool:
        """``task_id`` runs even if a usable detail exists (``--lf`` selected it)."""
        return self.rerun_selected and task_id in self.wanted

    def watch_retries(self, callback: Callable[[str, str], None]) -> None:
        """Call ``callback(task id, stage)`` for every runtime retry of the request's tasks (a progress display)."""
        self.ctx.events.on_retry = callback

    def want(self, task_ids: Iterable[str]) -> None:
        """The tasks pytest will run, once they are known (the xdist controller learns them from the workers)."""
        known = {t.task_id for t in self.tasks}
        self.wanted = set(task_ids) & known

    # -- before any task runs --------------------------------------------------
    async def preflight(self) -> None:
        """Check the components before the deadline starts; a failure fails the request (:attr:`failed`)."""
        try:
            await self._preflight()
        except PreflightError as exc:
            self._fail(str(exc), FAILED_PREFLIGHT)

    async def _preflight(self) -> None:
        ctx = self.ctx
        try:
            await ctx.provider.preflight()
        except Exception as exc:  # an SDK's own error (a failed pull, a refused connection) included
            self.failed_status = RunStatus.ENVIRONMENT_ERROR
            where = "" if isinstance(exc, AgentCompassError) else f"environment {ctx.req.environment.id!r} preflight: "
            raise PreflightError(f"request {self.name!r}: {where}{_reason(exc)}") from None
        self.notes.extend(getattr(ctx.provider, "notes", ()))
        try:
            if ctx.gateway is not None:
                ctx.gateway.preflight()
            if ctx.harness is not None:
                await call_user(ctx.harness.preflight, ctx.req)
            if self.tasks:
                # A plan the provider cannot honour fails here, before anything opens.
                await ctx.planner.plan(self.tasks[0], 0)
        except BenchmarkPlanError:
            pass  # the benchmark's own fault: every task it hits reports it
        except Exception as exc:
            raise PreflightError(f"request {self.name!r}: {_reason(exc)}") from None

    async def sweep(self) -> None:
        """Remove what killed runs of this request left (the role's part); before any request of the session
        starts a task. A failure is raised when the run is opened."""
        await self.role.sweep(self)

    async def open_run(self) -> list[TaskOutcome]:
        """Open the run (the role's part: its directory made ready) and queue what is left to run here.

        Returns the outcomes of wanted tasks taken from resumed or carried-over details.
        A failure fails the request (:attr:`failed`) and returns nothing.
        """
        try:
            recorded = await self.role.open_run(self)
        except Exception as exc:  # a broken request fails alone
            log.error("request %s: preparation failed: %s", self.name, exc)
            self._fail(f"request {self.name!r}: preparation failed: {type(exc).__name__}: {exc}", NOT_OPENED)
            return []
        taken: list[TaskOutcome] = []
        if recorded is not None:  # else its tasks are handed over one by one (:meth:`accept`)
            for task in self.tasks:
                outcome = recorded.get(task.task_id)
                if outcome is not None:
                    self.outcomes[task.task_id] = outcome
                    if task.task_id in self.wanted:
                        taken.append(outcome)
                elif task.task_id in self.wanted:
                    self.pending.append(task)
            self.resumed_done = sum(1 for o in taken if o.resumed)
            self.resumed_total = sum(1 for o in self.outcomes.values() if o.resumed)
            if self.order:
                # pytest's item order wins (``--ff``, ``-p randomly``, reordering plugins).
                self.pending = deque(sorted(self.pending, key=lambda t: self.order.get(t.task_id, 0)))
        self.opened = True
        return taken

    async def open_run_for_others(self) -> None:
        """Check and open a run whose tasks other processes run (the xdist controller), on one loop.

        What the checks opened on that loop (a harness's model client, the provider's
        clients, :attr:`resources`) is closed before the loop ends: no task runs here.
        """
        try:
            await self.preflight()
            if self.failed is None:
                await self.open_run()  # a failure is recorded; the other processes run the tasks all the same
        finally:
            await self.aclose()

    def _fail(self, message: str, how: str) -> None:
        self.failed, self.failed_how, self.opened = message, how, True

    # -- tasks ---------------------------------------------------------------------
    def accept(self, task: TaskSpec) -> TaskOutcome | None:
        """Take ``task``, handed over to run here; its outcome if it is not to run (recorded, or the request failed)."""
        self.wanted.add(task.task_id)
        recorded = self.role.recorded(self, task)
        if recorded is not None:  # resumed or carried over: reported, not run
            self.outcomes[task.task_id] = recorded
            return recorded
        if self.failed is not None:  # handed over after its request failed
            return self.not_run(task)
        self.pending.append(task)
        return None

    def next_task(self) -> TaskSpec:
        """The next pending task, now active."""
        task = self.pending.popleft()
        self.active[task.task_id] = task
        return task

    async def run(self, task: TaskSpec) -> TaskOutcome:
        """Run ``task`` to its terminal outcome and record it; a bug below costs this task alone."""
        try:
            outcome = await self._run(task)
        except Exception as exc:
            log.exception("task %s of request %s failed inside the runtime", task.task_id, self.name)
            outcome = self.error_outcome(task, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            self.active.pop(task.task_id, None)
        self.outcomes[task.task_id] = outcome
        return outcome

    async def _run(self, task: TaskSpec) -> TaskOutcome:
        with capture_task_logs() as capture:
            outcome = await run_attempts(self.ctx, task)
        redactor = self.store.redactor
        if redactor:  # a key read at run time is no ${VAR}: mask it in what the report shows
            outcome.logs = [redactor.text(line) for line in capture.logs]
            outcome.output = redactor.text("".join(capture.output))
        else:
            outcome.logs = capture.logs
            outcome.output = "".join(capture.output)
        # Notes about ignored state must be visible in the summary, not only in one detail.
        self.notes.extend(f"task {task.task_id}: {note}" for note in outcome.notes if note.startswith("ignored"))
        return outcome

    def not_run(self, task: TaskSpec) -> TaskOutcome:
        """Record ``task`` as not run because its request failed; the reason is printed once, in the summary."""
        message = f"not run: request {self.name!r} {self.failed_how} (the reason is in the agentcompass summary)"
        outcome = self.error_outcome(task, message, self.failed_status)
        outcome.not_run_reason = self.failed
        self.outcomes[task.task_id] = outcome
        return outcome

    def fail_unrun(self) -> list[TaskOutcome]:
        """Record every wanted task still without an outcome as not run (the request failed)."""
        self.pending.clear()
        return [self.not_run(t) for t in self.tasks if t.task_id in self.wanted and t.task_id not in self.outcomes]

    def cancel_unfinished(
        self, status: OrchestrationStatus, reason: str, running: Sequence[TaskSpec]
    ) -> list[TaskOutcome]:
        """Record as cancelled what is pending and ``running`` (every wanted task, if its run is not open yet).

        A cancelled task counts as an error, not as nothing. The run records how it ended.
        """
        if self.opened:
            unfinished = [*self.pending, *running]
        else:  # a Ctrl-C during the preflights
            unfinished = [t for t in self.tasks if t.task_id in self.wanted and t.task_id not in self.outcomes]
        self.pending.clear()
        why = reason if status is OrchestrationStatus.INTERRUPTED else f"{status}: {reason}"
        cancelled = []
        for task in unfinished:
            outcome = self.outcomes[task.task_id] = self.cancelled_outcome(task, why)
            cancelled.append(outcome)
        if not self.finalized and self.failed is None:
            self.end(RequestState(status), reason)
            self.finalized = True
        return cancelled

    def cancelled_outcome(self, task: TaskSpec, reason: str) -> TaskOutcome:
        result = RunResult(task.task_id, status=RunStatus.CANCELLED, error=reason)
        return TaskOutcome(request=self.name, task=task, result=result, passed=False)

    def error_outcome(self, task: TaskSpec, message: str, status: RunStatus = RunStatus.INFERENCE_ERROR) -> TaskOutcome:
        result = RunResult(task.task_id, status=status, error=message)
        return TaskOutcome(request=self.name, task=task, result=result, passed=False)

    async def aclose(self) -> None:
        """Release what the harness, the provider and :attr:`resources` hold for the request's tasks.

        A failure belongs to no task: it is a warning and a note of the request's
        summary (:attr:`closing_notes`, which an xdist worker hands its controller).
        """
        harness = self.ctx.harness
        if harness is not None:
            try:
                await call_user(harness.aclose)
            except Exception as exc:
                self._closing_failed("the harness", exc)
        await self._close_gateway()
        try:
            await self.ctx.provider.aclose()  # its clients (a pool of engines: the containers it still owes)
        except Exception as exc:
            self._closing_failed("the environment", exc)
        try:
            await self.resources.aclose()
        except Exception as exc:
            self._closing_failed("the request's resources", exc)

    async def _close_gateway(self) -> None:
        """Stop the request's model gateway (before the provider, which removes the networks it listens on)."""
        if self.ctx.gateway is not None:
            try:
                await self.ctx.gateway.aclose()
            except Exception as exc:
                self._closing_failed("the model gateway", exc)

    def _closing_failed(self, what: str, exc: Exception) -> None:
        note = f"closing {what} failed: {type(exc).__name__}: {exc}"
        log.warning("request %s: %s", self.name, note)
        self.closing_notes.append(note)
        self.notes.append(note)

    # -- the end ---------------------------------------------------------------------
    async def finalize(self, status: RequestState = RequestState.COMPLETED) -> None:
        """Aggregate in task order and write ``summary.json`` and the final ``run_info.json`` (the run's owner)."""
        await self.role.finalize(self, status)
        self.finalized = True

    async def write_summary(self, status: RequestState) -> None:
        """Aggregate the metrics and write ``summary.json`` (the owner's part of :meth:`finalize`)."""
        # What the provider learned during the run (an engine that stopped answering).
        self.notes.extend(n for n in getattr(self.ctx.provider, "notes", ()) if n not in self.notes)
        ordered = [self.outcomes[t.task_id] for t in self.tasks if t.task_id in self.outcomes]
        self.metrics, self.usage = await aggregate(self.ctx, ordered)
        self.summary = {
            "request": self.name,
            "run_id": self.ctx.run_id,
            "status": status,
            "metrics": to_jsonable(self.metrics),
            "counts": self.counts(),
            "usage": self.usage,
            "tasks": [summary_record(o) for o in ordered],
        }
        try:
            self.store.write_summary(self.summary)
            self.store.drop_empty_checkpoints()
        except OSError as exc:  # the run directory went read-only or full during the run
            self.unwritten_file("summary.json", exc)

    def end(self, status: RequestState, reason: str) -> None:
        """Record how a request that did not complete ended (its unfinished tasks named) and give the run back."""
        unfinished = [
            t.task_id
            for t in self.tasks
            if t.task_id in self.wanted
            and (t.task_id not in self.outcomes or self.outcomes[t.task_id].result.status is RunStatus.CANCELLED)
        ]
        if unfinished and status is not RequestState.FAILED:  # a failed request's summary line says why already
            # Any run that did not complete is what the next run of the same config picks up.
            note = f"{status}: {reason}; the next run resumes it"
            if note not in self.notes:
                self.notes.append(note)
        self.role.end(self, status, stop_reason=reason, unfinished_tasks=unfinished)

    def close_failed(self) -> None:
        """A request that failed before running: its run records why, and is given back."""
        assert self.failed is not None
        self.end(RequestState.FAILED, self.failed)
        self.finalized = True

    def close_unopened(self, reason: str) -> None:
        """A request the run stopped before its run was opened: the run directory says so (and is resumable)."""
        self.end(RequestState.STOPPED, reason)
        self.finalized = True

    def release(self) -> None:
        """Give the run directory back without recording anything (nothing was done in it)."""
        self.store.close()
        release_run_dir(self.store.run_dir)

    async def finalize_run_of_others(
        self,
        ending: OrchestrationStatus,
        reason: str | None,
        notes: Iterable[str] = (),
        failed_elsewhere: str | None = None,
        sent: Sequence[tuple[str, str, bytes]] | None = None,
    ) -> bool:
        """Finalize a run other processes ran (the xdist controller), from the details they wrote, once.

        Returns ``False`` when there is nothing to report: the request's run
        was never opened and no task of it was left to record. The request is
        :attr:`finalized` only when its summary was written (completed, or
        stopped by ``-x``).

        :param notes: What the other processes noted mid-run (an engine that stopped answering).
        :param failed_elsewhere: Why the request failed in another process (a worker's preflight):
            what the tasks it did not run are recorded with.
        :param sent: ``(task id, detail text, page record)`` of every detail the other processes wrote
            (``RunStore.written``), when each of them sent its own: the details are then
            not read back, but for a task none of them sent (read alone). ``None``: every
            detail in ``details/`` is read.
        """
        if not self.opened and (ending is OrchestrationStatus.COMPLETED or not self.wanted or self.failed is not None):
            if ending is OrchestrationStatus.INTERRUPTED and self.failed is None:
                # A Ctrl-C before any task was handed out: recorded, not left "created".
                self.end(RequestState.INTERRUPTED, reason or INTERRUPTED_BY_USER)
            else:
                self.release()
            return False
        # (Not opened but with tasks chosen: a Ctrl-C during the preflights. Its
        # tasks are recorded as cancelled below, as in process.)
        self.notes.extend(n for n in notes if n not in self.notes)
        by_id = {t.task_id: t for t in self.tasks}
        for earlier in self.outcomes.values():  # taken when the run opened, whole: kept slim, as those read below
            earlier.slim()
        # Reading 10,000 details back cost the controller about 0.8 s after the last task, with both
        # cores otherwise idle (docs/performance.md, set Q): what the workers sent is taken instead.
        unrecorded = self.wanted - self.outcomes.keys()  # what no earlier session recorded
        details = self.store.iter_details() if sent is None else self.store.details_sent(sent, unrecorded)
        for detail in details:
            task = by_id.get(str(detail.get("task_id")))
            if task is None or detail.get("fingerprint") != self.ctx.task_fingerprint(task):
                continue
            outcome = outcome_from_detail(self.name, task, detail, self.store.detail_file(task.task_id))
            # Recorded before this session (taken when the run was opened): resumed, or carried over.
            before = self.outcomes.get(task.task_id)
            outcome.resumed = before is not None and before.resumed
            outcome.carried_over = before is not None and before.carried_over
            outcome.slim()
            self.outcomes[task.task_id] = outcome
        missing = {t for t in self.wanted if t not in self.outcomes}
        if self.failed is not None:
            # As in process: every task counts as not run, and the run records why.
            for outcome in self.fail_unrun():
                outcome.slim()
            self.end(RequestState.FAILED, self.failed)
        elif ending is OrchestrationStatus.STOPPED:
            await self.finalize(RequestState.STOPPED)
        elif ending is not OrchestrationStatus.COMPLETED or missing:
            status = RequestState(ending) if ending is not OrchestrationStatus.COMPLETED else RequestState.INTERRUPTED
            if failed_elsewhere is not None and not reason:
                reason = f"{len(missing)} task(s) not run: on one of the xdist workers, {failed_elsewhere}"
            reason = reason or f"{len(missing)} task(s) ended without a result (a worker was lost)"
            for task in self.tasks:  # counted as errors in the summary, as in process
                if task.task_id in missing:
                    self.outcomes[task.task_id] = self.cancelled_outcome(task, f"{status}: {reason}")
            self.end(status, reason)
        else:
            await self.finalize()
        return True

    def note(self, text: str) -> None:
        """A line for the request's summary (said at the end, with its counts)."""
        self.notes.append(text)

    def unwritten_file(self, name: str, exc: Exception) -> None:
        """``name`` could not be written: said in the summary, and the session fails (plugin/verdicts.py)."""
        message = f"could not write {name} in {self.store.run_dir}: {type(exc).__name__}: {exc}"
        log.warning("request %s: %s", self.name, message)
        self.notes.append(message)
        self.unwritten.append(name)

    # -- what the end of the session reads -----------------------------------------------
    def counts(self) -> dict[str, int]:
        return count_outcomes(self.outcomes.values())

    def final_summary(self) -> RequestSummary:
        """This request as the terminal summary shows it (values, read once the run ended)."""
        return RequestSummary(
            name=self.name,
            run_dir=self.store.run_dir,
            counts=self.counts(),
            failed=self.failed,
            metrics=self.metrics,
            usage=self.usage,
            notes=tuple(self.notes),
            kept_environments=tuple(
                (outcome.task.task_id, env)
                for outcome in self.outcomes.values()
                if not (outcome.carried_over or outcome.resumed)
                for env in outcome.kept_environments
            ),
            flagged=tuple(flagged_tasks(self.tasks, self.outcomes)),
        )

    def forget_outcomes(self) -> None:
        """Drop every outcome once the session is reported (pytest's last collections walk the heap)."""
        self.outcomes.clear()


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, AgentCompassError) else f"{type(exc).__name__}: {exc}"
