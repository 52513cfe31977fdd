"""Running under pytest-xdist (``-n``): the controller's side.

The controller collects nothing, but it owns the run: before any worker
starts it claims each request's run directory (a new one, or the newest
unfinished one to resume; ``--agentcompass-reuse`` as in process) and starts
the permit service that makes ``task_concurrency``, ``capacity`` and
``open_qps`` run-wide. Once the workers' collections are known it prepares
the runs (``run_info.json``, the sweep of what a killed run left behind,
reused details copied in), and the scheduler hands every worker enough
tasks to keep its concurrent loop (:mod:`.worker`) full. When the session
ends it finalizes each request once, from the details on disk:
``summary.json``, ``run_info.json``, ``pytest_agentcompass_request_finalized``
and the terminal summary. A session that was interrupted, or that leaves a
task without a result (a worker was killed), is recorded ``interrupted`` and
resumes on the next run like any other unfinished run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import AgentCompassError, PreflightError
from ..runtime.collector import fewer_collections
from ..runtime.driver import TERMINATED_REASON, Terminated, say, sigterm_interrupts
from ..runtime.orchestrator import OrchestrationResult, not_run
from ..runtime.request import RequestRuntime
from ..runtime.store import release_run_dir
from ..runtime.task import TaskOutcome, outcome_from_detail
from ..runtime.threads import run_with_pool, workers_for
from .outcomes import NotRunText

if TYPE_CHECKING:
    from ..permit_service import PermitService
    from ..types import TaskSpec
    from .keys import RunHandle
    from .nodes import TaskItem

__all__ = ["DistributedRun", "run_single_task"]

#: Keys of ``config.workerinput`` (set by the controller for each worker).
RUN_ID, RUN_DIRS, PERMITS = "agentcompass_run_id", "agentcompass_run_dirs", "agentcompass_permits"
#: A serialized report's key for the two parts of a :class:`NotRunText`.
NOT_RUN = "agentcompass_not_run"
#: The worker's loop plugin, registered by :class:`DistributedRun` on workers.
WORKER_PLUGIN = "agentcompass-worker"


class DistributedRun:
    """Hooks that only exist while xdist is in use; registered by the run in ``pytest_configure``."""

    def __init__(self, run: RunHandle) -> None:
        self.run = run
        self.config = run.config
        #: The controller's runtime of each request whose run directory it claimed.
        self.states: dict[str, RequestRuntime] = {}
        #: Tasks that had a usable result before this session: task id -> resumed (else reused).
        self.recorded: dict[str, dict[str, bool]] = {}
        self.ran_unbuilt: set[str] = set()  # requests it could not build whose tasks still ran on workers
        self.preflight_failed: set[str] = set()  # requests whose preflight failed here, in the controller
        self.service: PermitService | None = None
        self.session: pytest.Session | None = None
        #: SIGINT's handler before a Ctrl-C made the controller hold the next one (see _hold_next_interrupt).
        self._previous_sigint: Any = None
        #: SIGTERM's, likewise: held while the workers wind down after a Ctrl-C or SIGTERM.
        self._previous_sigterm: Any = None
        #: Requests the controller could not build (their runs are not finalized), and why.
        self.unbuilt: dict[str, str] = {}
        #: Gate items the workers selected and left to the controller: node id -> file.
        self.gates: dict[str, str] = {}
        #: What the workers' providers noted mid-run, by request (an engine that stopped answering).
        self.worker_notes: dict[str, list[str]] = {}
        self.finalized = False
        #: ``<status>: <reason>`` of the first task a worker cancelled (its deadline), if any.
        self.cancelled: str | None = None
        #: The task items the workers collected, and those whose reports reached the controller.
        self.task_nodeids: list[str] = []
        self.reported: set[str] = set()
        self.interrupt_reported = False
        #: What interrupted the session: a Ctrl-C, or a SIGTERM (said as such in the record and the errors).
        self.interrupt_reason = "interrupted by the user"
        workerinput = getattr(self.config, "workerinput", None)
        if workerinput is not None:
            from .worker import WorkerPlugin

            if workerinput.get(PERMITS):
                from ..limits import use_permit_service

                use_permit_service(workerinput[PERMITS])
            self.config.pluginmanager.register(WorkerPlugin(run, workerinput.get(RUN_DIRS) or {}), WORKER_PLUGIN)

    @property
    def task_concurrency(self) -> int:
        return int(self.config.getoption("agentcompass_concurrency") or self.run.orchestration.task_concurrency)

    # -- the controller, before the workers start --------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not self.run.is_worker and self.config.getvalue("dist") == "each":
            # Every worker would run every task, all into one run directory.
            raise pytest.UsageError(
                "--agentcompass with --dist each would run every task once per worker into one run; "
                "use --dist load (the default with -n), or run the config once per environment instead"
            )
        self.session = session

    def _claim(self) -> None:
        """Build every request and claim its run directory, once, as the first worker is configured.

        Not earlier: session fixtures (components may come from them) need the
        session's fixture manager, made in ``pytest_sessionstart``; not later:
        the workers need the run directories in their ``workerinput``.
        """
        session = self.session
        if self.service is not None or session is None or self.config.option.collectonly:
            return
        for index, req in enumerate(self.run.orchestration.requests):
            try:
                setup = self.run.build(index, req, session)
            except Exception as exc:  # the workers collect it too; an error there is theirs to report
                self.unbuilt[req.name] = f"{type(exc).__name__}: {exc}"
                continue
            try:
                self.states[req.name] = self.run.runtime(setup, set(), resume=True)
            except AgentCompassError as exc:
                self._release()
                raise self.run.usage_error(exc) from None
        from ..permit_service import PermitService

        self.service = PermitService()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        self._claim()
        node.workerinput[RUN_ID] = self.run.run_id
        node.workerinput[RUN_DIRS] = {name: str(state.store.run_dir) for name, state in self.states.items()}
        node.workerinput[PERMITS] = self.service.address if self.service else None

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "load":
            return None  # the user chose another distribution: the workers' loops still run concurrently
        from .scheduling import TaskScheduling

        return TaskScheduling(config, log, depth=2 * self.task_concurrency, on_collection=self.prepare)

    def prepare(self, nodeids: Sequence[str]) -> None:
        """Prepare every claimed run for the tasks the workers collected (once, before any is sent)."""
        wanted: dict[str, set[str]] = {name: set() for name in self.states}
        config_name = self.run.loaded.path.name
        for nodeid in nodeids:
            parts = nodeid.split("::")
            if len(parts) == 3 and parts[0].endswith(config_name) and parts[1] in wanted:
                wanted[parts[1]].add(parts[2])
                self.task_nodeids.append(nodeid)
        rerun = bool(self.config.getoption("lf", False))
        for name, state in self.states.items():
            known = {t.task_id for t in state.tasks}
            state.wanted = wanted[name] & known
            state.rerun = set(state.wanted) if rerun else set()
            try:
                # The workers' tasks only point at the summary: the reason is
                # found here, once, and printed there (as without xdist).
                asyncio.run(state.preflight())
            except PreflightError as exc:
                state.failed, state.prepared = str(exc), True
                self.preflight_failed.add(name)
                state.pending.clear()
                continue
            try:
                asyncio.run(state.prepare())
            except Exception as exc:  # reported with the summary; the tasks still run
                state.failed = f"request {name!r}: preparing the run directory failed: {type(exc).__name__}: {exc}"
            state.pending.clear()  # the workers run them
            self.recorded[name] = {task_id: o.resumed for task_id, o in state.outcomes.items()}
            if state.resumed and state.failed is None:
                done = f"{state.resumed_done} of {len(state.wanted)} tasks done"
                self.run.say(f"agentcompass: {name}: resuming {state.store.run_dir} ({done})")

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The controller: once ``-x``/``--maxfail`` is reached, every worker stops starting tasks.

        It also notes why a worker cancelled tasks (its deadline), for ``run_info.json``.
        """
        self.reported.add(report.nodeid)
        if self.unbuilt and report.when == "setup":
            parts = report.nodeid.split("::")
            if len(parts) == 3 and parts[1] in self.unbuilt:
                self.ran_unbuilt.add(parts[1])
        if report.when == "setup" and report.failed and self.cancelled is None:
            first = str(report.longrepr).split("\n", 1)[0]
            if first.startswith("cancelled: "):  # "cancelled: timeout: orchestration timeout of 2s reached"
                self.cancelled = first[len("cancelled: ") :]
        session = getattr(self, "session", None)
        if self.service is not None and session is not None and (session.shouldfail or session.shouldstop):
            self.service.stop_all(str(session.shouldfail or session.shouldstop))

    # -- reports on the wire (worker -> controller) -----------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(self, config: pytest.Config, report: Any) -> Generator[None, Any, Any]:
        """On a worker: a not-run task's report keeps its two parts (xdist would send ``str()``,
        and the controller's terminal would print the request's reason once per task)."""
        data = yield
        longrepr = getattr(report, "longrepr", None)
        if isinstance(data, dict) and isinstance(longrepr, NotRunText):
            data[NOT_RUN] = [longrepr.text, longrepr.reason]
        return data

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(self, config: pytest.Config, data: Any) -> Generator[None, Any, Any]:
        """On the controller: rebuild what :meth:`pytest_report_to_serializable` took apart."""
        parts = data.pop(NOT_RUN, None) if isinstance(data, dict) else None
        report = yield
        if parts is not None and report is not None:
            report.longrepr = NotRunText(*parts)
        return report

    # -- the controller, at the end -----------------------------------------------------
    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        """A Ctrl-C on the controller: the workers cancel their tasks, within the cleanup grace.

        Before ``pytest_sessionfinish``, where xdist tears the workers down.
        A Ctrl-C in a terminal reaches the workers too; ``kill -INT`` only this process.
        """
        if isinstance(getattr(excinfo, "value", None), Terminated):
            self.interrupt_reason = TERMINATED_REASON
        if self.service is not None and not self.run.is_worker:
            self.service.stop_all(self.interrupt_reason, interrupt=True)
        if not self.run.is_worker:
            self._hold_next_interrupt()

    def _hold_next_interrupt(self) -> None:
        """A second Ctrl-C while the workers wind down is said, not raised; a third leaves at once.

        The workers leave at once on their own second SIGINT (a terminal sends it
        to them too). Raised here, it would end xdist's teardown, which waits for
        them, and skip everything after it: the junit file, the run's summary
        and the ``interrupted`` record, as without xdist it does not. A SIGTERM
        meanwhile is said too, not obeyed, for the same reason.
        """
        if threading.current_thread() is not threading.main_thread() or self._previous_sigint is not None:
            return
        presses = 0

        def on_sigint(signum: int, frame: object) -> None:
            nonlocal presses
            presses += 1
            if presses > 1:
                raise KeyboardInterrupt
            say("\nagentcompass: exiting as soon as the workers stop; recording the run\n")

        def on_sigterm(signum: int, frame: object) -> None:
            # Its default would end the controller before it records the run (run_info says running).
            say("\nagentcompass: terminated (SIGTERM); recording the run as soon as the workers stop\n")

        self._previous_sigint = signal.signal(signal.SIGINT, on_sigint)
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        from .gates import WORKER_GATES
        from .worker import WORKER_NOTES

        output = getattr(node, "workeroutput", {})
        if output.get("exitstatus") == pytest.ExitCode.INTERRUPTED and self.service is not None:
            # A worker interrupted alone (a task raised KeyboardInterrupt): the others stop too, as for Ctrl-C.
            self.service.stop_all("interrupted by the user", interrupt=True)
        for nodeid, fspath, _ in output.get(WORKER_GATES, ()):
            self.gates[nodeid] = fspath
        for request, notes in output.get(WORKER_NOTES, {}).items():
            known = self.worker_notes.setdefault(request, [])
            known.extend(note for note in notes if note not in known)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        if self.run.is_worker:
            return (yield)  # the worker's own loop handles SIGTERM (plugin/worker.py)
        with sigterm_interrupts():  # as a Ctrl-C on the controller (the workers' own SIGTERM skips their grace)
            result = yield
        # Finalize here, not at session end: the gate items' reports must
        # count in the exit code, which pytest computes after this loop.
        self._finalize_all(session, interrupted=False)
        from .gates import report_gate

        # xdist counted the items the workers kept: the gates come on top.
        session.testscollected += len(self.gates)
        for nodeid, fspath in self.gates.items():
            report_gate(session.config, self.run, nodeid, fspath)
        return result

    # (pytest takes hook implementations only from names starting with "pytest_")
    @pytest.hookimpl(tryfirst=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_report_unreported(self, session: pytest.Session, exitstatus: int) -> None:
        """An interrupted run: every task no worker reported is an error, in the counts and in junit.

        As in process, where a task that was running or not yet started when
        Ctrl-C came ends as a setup error. First among the session-finish
        hooks: junit's writes its file in its own.
        """
        if self.run.is_worker or exitstatus != pytest.ExitCode.INTERRUPTED:
            return
        if session.shouldfail or session.shouldstop:
            return  # -x or --maxfail: what never ran is not reported, as with pytest's own loop
        hook = session.config.hook
        tasks_of: dict[str, dict[str, TaskSpec]] = {}
        for nodeid in dict.fromkeys(self.task_nodeids):
            if nodeid in self.reported:
                continue
            path, _, name = nodeid.partition("::")
            request, _, task_id = name.partition("::")
            state = self.states.get(request)
            if state is not None and os.path.exists(state.store.detail_path(task_id)):
                continue  # it ended on its worker, whose report was lost: the summary counts it from its detail
            location = (path, None, name)
            why: object = f"cancelled: {self.interrupt_reason}"
            if state is not None and request in self.preflight_failed and state.failed:
                # Its request's preflight failed before the Ctrl-C: that is what it reports, as in process.
                if request not in tasks_of:  # once per request, not a scan per task
                    tasks_of[request] = {t.task_id: t for t in state.tasks}
                task = tasks_of[request].get(task_id)
                if task is not None:
                    failed = not_run(state, task, "failed its preflight")
                    why = NotRunText(str(failed.result.error), self.run.redactor.text(state.failed))
            hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
            for when, outcome, longrepr in (
                ("setup", "failed", why),
                ("teardown", "passed", None),
            ):
                report = pytest.TestReport(nodeid, location, {}, outcome, longrepr, when)  # type: ignore[arg-type]
                hook.pytest_runtest_logreport(report=report)
            hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)
        # These errors count towards -x/--maxfail in pytest's session (which
        # cannot be undone): the run is still recorded interrupted, not stopped.
        self.interrupt_reported = True

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.run.is_worker:
            _ignore_the_teardown_sigint()
            return
        try:  # the loop was interrupted: still record what is on disk
            self._finalize_all(session, interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        finally:
            if self.service is not None:
                self.service.close()

    def _finalize_all(self, session: pytest.Session, *, interrupted: bool) -> None:
        if self.finalized:
            return
        self.finalized = True
        result = OrchestrationResult()
        if self.interrupt_reported:
            result.status, result.reason = "interrupted", self.interrupt_reason
        elif session.shouldfail or session.shouldstop:
            result.status, result.reason = "stopped", str(session.shouldfail or session.shouldstop)
        elif interrupted:
            result.status, result.reason = "interrupted", self.interrupt_reason
        elif self.cancelled is not None:  # a worker's deadline passed: "timeout: <reason>"
            status, _, reason = self.cancelled.partition(": ")
            result.status, result.reason = (status, reason) if reason else ("interrupted", status)
        self.run.result = result
        with fewer_collections():  # ten thousand outcomes are built from their details
            self.run.runtimes = [s for s in (self._finalize(s, result) for s in self.states.values()) if s]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        # Usually the workers could not build it either: their collection error is the one message.
        for name, why in self.unbuilt.items():
            if name not in self.ran_unbuilt:
                continue
            terminalreporter.write_line(
                self.run.redactor.text(
                    f"agentcompass: request {name!r} ran on the workers but is not finalized: the xdist controller, "
                    f"which collects nothing, could not build it ({why})"
                ),
                yellow=True,
            )

    def _finalize(self, state: RequestRuntime, result: OrchestrationResult) -> RequestRuntime | None:
        """Finalize one request from the details the workers wrote, once."""
        if not state.prepared and (result.status == "completed" or not state.wanted or state.failed is not None):
            if result.status == "interrupted" and state.failed is None:
                # A Ctrl-C before any task was handed out: recorded, not left "created".
                state.stop("interrupted", result.reason or "interrupted by the user")
            else:
                release_run_dir(state.store.run_dir)
            return None
        # (Unprepared but with tasks chosen: a Ctrl-C during the preflights. Its
        # tasks are recorded as cancelled below, as in process.)
        state.notes.extend(n for n in self.worker_notes.get(state.name, ()) if n not in state.notes)
        recorded = self.recorded.get(state.name, {})
        by_id = {t.task_id: t for t in state.tasks}
        # Kept for the run's page, which would otherwise read them all again
        # (it holds them all at once either way).
        details = list(state.store.iter_details())
        for detail in details:
            task = by_id.get(str(detail.get("task_id")))
            if task is None or detail.get("fingerprint") != state.ctx.task_fingerprint(task):
                continue
            outcome = outcome_from_detail(state.name, task, detail, state.store.detail_path(task.task_id))
            # Recorded before this session: kept from the run it resumes, or copied by reuse.
            outcome.resumed = recorded.get(task.task_id) is True
            outcome.reused = recorded.get(task.task_id) is False
            outcome.slim()
            state.outcomes[task.task_id] = outcome
        missing = [t for t in state.wanted if t not in state.outcomes]
        if state.name in self.preflight_failed and state.failed is not None:
            # As in process: every task counts as not run, and the run records why.
            for task in state.tasks:
                if task.task_id in state.wanted and task.task_id not in state.outcomes:
                    not_run(state, task, "failed its preflight").slim()
            state.stop("failed", state.failed)
            return state
        if result.status == "stopped":
            asyncio.run(state.finalize("stopped"))
        elif result.status != "completed" or missing:
            status = result.status if result.status != "completed" else "interrupted"
            reason = result.reason or f"{len(missing)} task(s) ended without a result (a worker was lost)"
            for task in state.tasks:  # counted as errors in the summary, as in process
                if task.task_id in missing:
                    state.outcomes[task.task_id] = state.cancelled_outcome(task, f"{status}: {reason}")
            state.stop(status, reason)
            state.notes.append(f"{status}: {reason}; the next run resumes it")
            return state
        else:
            asyncio.run(state.finalize())
        self.run.request_finalized(state, details)
        return state

    def _release(self) -> None:
        for state in self.states.values():
            state.store.close()
            release_run_dir(state.store.run_dir)
        self.states.clear()


def _ignore_the_teardown_sigint() -> None:
    """A worker whose session is over ignores SIGINT from here on, until its process ends.

    Once every worker has said it finished, xdist's controller tells the
    workers' gateways to end, and execnet sends a worker SIGINT if it is
    still busy 5 s later (``WorkerGateway._terminate_execution``). A worker
    has more to do after it said it finished: the other plugins' terminal
    summaries (hypothesis' imports its whole package, 2.5 s on a slow
    machine) and pytest's garbage collections at unconfigure. On a loaded
    machine that outlasts the 5 s, and the ``KeyboardInterrupt`` surfaced
    wherever the worker was ("Exception ignored in ... KeyboardInterrupt").
    Nothing is left to interrupt: every task is reported, the store is
    closed, and a Ctrl-C reaches the controller, which records the run. Not
    restored at unconfigure: the collections run after it.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


async def _run_and_close(state: RequestRuntime, task: TaskSpec) -> TaskOutcome:
    # Each task gets its own event loop here: what the harness holds on this
    # loop (a model client) must be closed before the loop is.
    try:
        return await state.run(task)
    finally:
        await state.aclose()


def run_single_task(run: RunHandle, item: TaskItem) -> TaskOutcome:
    """Run one task to its terminal outcome under the standard protocol.

    Only used when another plugin replaced the plugin's own loop; under xdist
    the workers run :mod:`.worker`'s concurrent loop instead.
    """
    state = run.runtime(item.setup_info, {item.task.task_id}, resume=False)
    try:
        grace = run.orchestration.cleanup_grace_seconds
        outcome = run_with_pool(_run_and_close(state, item.task), max_workers=workers_for(1), grace=grace)
    except (KeyboardInterrupt, asyncio.CancelledError):
        outcome = state.cancelled_outcome(item.task, "cancelled: interrupted")
    state.store.close()
    return outcome
