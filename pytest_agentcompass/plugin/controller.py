"""The xdist controller (``-n``): it runs no task, but owns every request's run.

Before any worker starts it builds each request and claims its run directory
(a new one, or the newest unfinished one to resume; ``--agentcompass-carry-over``
as in process) and starts the permit service that makes ``task_concurrency``,
``capacity`` and ``open_qps`` run-wide. Once the first worker's collection is
in, and before any item is sent, it opens each run for the tasks pytest
selected (``run_info.json``, the sweep of what a killed run left behind,
carried-over details copied in). When xdist's loop ends it finalizes each request
once, from the details the workers wrote, then reports the gate items the
workers left to it; an interrupted loop is finalized at the session's end.
Every one of those steps is a method of the request's runtime
(``runtime.request``); this module only says when.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from ..runtime.driver import sigterm_interrupts
from ..runtime.gc_tuning import fewer_collections
from ..runtime.orchestrator import OrchestrationResult
from ..runtime.request import INTERRUPTED_BY_USER, RequestRuntime
from ..vocabulary.errors import AgentCompassError
from ..vocabulary.types import OrchestrationStatus
from .keys import DEV_MODE, PERMITS, RUN_DIRS, RUN_ID, WORKER_DETAILS, WORKER_FAILED, WORKER_NOTES
from .wire import unpack_events

if TYPE_CHECKING:
    from ..concurrency.permits import PermitService
    from .keys import RunHandle

__all__ = ["ControllerRun", "task_ids_by_request"]


class ControllerRun:
    """The controller's hooks (registered by ``xdist.register_side`` when this process is it)."""

    def __init__(self, run: RunHandle) -> None:
        self.run = run
        self.config = run.config
        #: The runtime of each request whose run directory this process claimed.
        self.states: dict[str, RequestRuntime] = {}
        #: Requests the controller could not build (their runs are not finalized), and why.
        self.unbuilt: dict[str, str] = {}
        self.ran_unbuilt: set[str] = set()  # requests it could not build whose tasks still ran on workers
        self.service: PermitService | None = None
        self.session: pytest.Session | None = None
        #: Gate items the workers selected and left to the controller: node id -> file.
        self.gates: dict[str, str] = {}
        #: What the workers noted mid-run, by request (an engine that stopped answering, a failed close).
        self.worker_notes: dict[str, list[str]] = {}
        #: Why a request failed on a worker (its preflight there), by request: the first worker's word.
        self.worker_failed: dict[str, str] = {}
        #: ``(task id, text, page record)`` of each detail the workers wrote, by request, sent at their end.
        self.worker_details: dict[str, list[tuple[str, str, bytes]]] = {}
        #: Workers started, and those that ended sending their details (a lost one sends nothing).
        self.workers_started = 0
        self.workers_sent = 0
        self.opened = False
        self.finalized = False
        #: ``<status>: <reason>`` of the first task a worker cancelled (its deadline), if any.
        self.cancelled: str | None = None
        #: The task items the workers collected, and those whose reports reached the controller.
        self.task_nodeids: list[str] = []
        self.reported: set[str] = set()
        #: The tasks no worker reported after a Ctrl-C were reported here (``interrupts``).
        self.interrupt_reported = False
        #: What interrupted the session: a Ctrl-C, or a SIGTERM (said as such in the record and the errors).
        self.interrupt_reason = INTERRUPTED_BY_USER

    # -- before the workers start ----------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.config.getvalue("dist") == "each":
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
                self.states[req.name] = self.run.own_runtime(setup, set())
            except AgentCompassError as exc:
                for state in self.states.values():
                    state.release()
                self.states.clear()
                raise self.run.usage_error(exc) from None
        from ..concurrency.permits import PermitService

        self.service = PermitService()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        self._claim()
        self.workers_started += 1
        node.workerinput[RUN_ID] = self.run.run_id
        node.workerinput[RUN_DIRS] = {name: str(state.store.run_dir) for name, state in self.states.items()}
        node.workerinput[PERMITS] = self.service.address if self.service else None
        node.workerinput[DEV_MODE] = bool(sys.flags.dev_mode)
        unpack_events(node)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "load":
            return None  # the user chose another distribution: the workers' loops still run concurrently
        from .scheduling import TaskScheduling

        return TaskScheduling(config, log, depth=2 * self.run.task_concurrency)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        """The first worker's collection is in: open the runs before xdist sends any item (every ``--dist``)."""
        if self.opened or not ids:
            return
        self.opened = True
        wanted = task_ids_by_request(ids, self.run.loaded.path.name, self.states)
        self.task_nodeids = [nodeid for nodeid in ids if _task_of(nodeid, self.run.loaded.path.name, self.states)]
        for name, state in self.states.items():
            state.want(wanted[name])
            # The workers' tasks only point at the summary: a preflight's reason is
            # found here, once, and printed there (as without xdist).
            asyncio.run(state.open_run_for_others())
            self.run.say_resuming(state)

    # -- while the workers run -------------------------------------------------------
    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Once ``-x``/``--maxfail`` is reached, every worker stops starting tasks.

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
        session = self.session
        if self.service is not None and session is not None and (session.shouldfail or session.shouldstop):
            self.service.stop_all(str(session.shouldfail or session.shouldstop))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        """xdist reports the task a lost worker was on as crashed; when the task had been
        recorded before, the run counts the record (a resume keeps it): the summary says why
        its count and pytest's differ."""
        found = _task_of(crashitem, self.run.loaded.path.name, self.states)
        if found is None:
            return
        request, task_id = found
        state = self.states[request]
        if state.store.has_detail(task_id):
            self.worker_notes.setdefault(request, []).append(
                f"task {task_id} has a record in the run directory, but its worker was lost before reporting it:"
                " pytest reports it as crashed, this summary counts the record"
            )

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        from .gate_items import WORKER_GATES

        output = getattr(node, "workeroutput", {})
        if output.get("exitstatus") == pytest.ExitCode.INTERRUPTED and self.service is not None:
            # A worker interrupted alone (a task raised KeyboardInterrupt): the others stop too, as for Ctrl-C.
            self.service.stop_all(INTERRUPTED_BY_USER, interrupt=True)
        for nodeid, fspath, _ in output.get(WORKER_GATES, ()):
            self.gates[nodeid] = fspath
        for request, why in output.get(WORKER_FAILED, {}).items():
            self.worker_failed.setdefault(request, why)
        for request, notes in output.get(WORKER_NOTES, {}).items():
            known = self.worker_notes.setdefault(request, [])
            known.extend(note for note in notes if note not in known)
        sent = output.pop(WORKER_DETAILS, None)  # taken off the node: held once, here
        if error is None and sent is not None:
            self.workers_sent += 1
            for request, written in sent.items():
                self.worker_details.setdefault(request, []).extend(written)

    # -- the end ------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        with sigterm_interrupts():  # as a Ctrl-C on the controller (the workers' own SIGTERM skips their grace)
            result = yield
        # Finalize here, not at session end: the gate items' reports must
        # count in the exit code, which pytest computes after this loop.
        self._finalize_all(session, interrupted=False)
        self._report_gates(session)
        return result

    def _report_gates(self, session: pytest.Session) -> None:
        """The gate items the workers left to the controller, judged on the finalized requests."""
        from .gate_items import report_gate

        # xdist counted the items the workers kept: the gates come on top.
        session.testscollected += len(self.gates)
        for nodeid, fspath in self.gates.items():
            report_gate(session.config, self.run, nodeid, fspath)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        try:  # the loop was interrupted: still record what is on disk
            self._finalize_all(session, interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        finally:
            if self.service is not None:
                self.service.close()

    def _finalize_all(self, session: pytest.Session, *, interrupted: bool) -> None:
        """Finalize every claimed run from the details the workers wrote, once; the summary reports what is returned.

        When the run completed and every worker ended sending what it wrote,
        the details come from what they sent; otherwise (a worker lost, a
        Ctrl-C, ``-x``: a task may have ended after its worker's last word)
        they are read from disk, as they always could be.
        """
        if self.finalized:
            return
        self.finalized = True
        status, reason = self._ending(session, interrupted)
        self.run.result = OrchestrationResult(status, reason)
        every_worker_sent = status is OrchestrationStatus.COMPLETED and self.workers_sent == self.workers_started
        reported = []
        with fewer_collections():  # ten thousand outcomes are built from their details
            for state in self.states.values():
                notes = self.worker_notes.get(state.name, ())
                failed = self.worker_failed.get(state.name)
                sent = self.worker_details.pop(state.name, []) if every_worker_sent else None
                if not asyncio.run(state.finalize_run_of_others(status, reason, notes, failed, sent)):
                    continue
                reported.append(state)
                if state.finalized:
                    self.run.request_finalized(state)
        self.worker_details.clear()
        self.run.runtimes = reported

    def _ending(self, session: pytest.Session, interrupted: bool) -> tuple[OrchestrationStatus, str | None]:
        """How the distributed run ended, from what the controller saw."""
        if self.interrupt_reported:
            return OrchestrationStatus.INTERRUPTED, self.interrupt_reason
        if session.shouldfail or session.shouldstop:
            return OrchestrationStatus.STOPPED, str(session.shouldfail or session.shouldstop)
        if interrupted:
            return OrchestrationStatus.INTERRUPTED, self.interrupt_reason
        if self.cancelled is not None:  # a worker's deadline passed: "timeout: <reason>"
            status, _, reason = self.cancelled.partition(": ")
            if reason and status in OrchestrationStatus.__members__.values():
                return OrchestrationStatus(status), reason
            return OrchestrationStatus.INTERRUPTED, self.cancelled
        return OrchestrationStatus.COMPLETED, None

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


def task_ids_by_request(nodeids: Sequence[str], config_name: str, states: dict[str, Any]) -> dict[str, set[str]]:
    """The task ids of each claimed request among the collected ``nodeids`` (``<config>::<request>::<task>``)."""
    wanted: dict[str, set[str]] = {name: set() for name in states}
    for nodeid in nodeids:
        task = _task_of(nodeid, config_name, states)
        if task is not None:
            wanted[task[0]].add(task[1])
    return wanted


def _task_of(nodeid: str, config_name: str, states: dict[str, Any]) -> tuple[str, str] | None:
    parts = nodeid.split("::")
    if len(parts) == 3 and parts[0].endswith(config_name) and parts[1] in states:
        return parts[1], parts[2]
    return None
