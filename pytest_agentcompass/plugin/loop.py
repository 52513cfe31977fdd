"""The run loop without xdist: every task on the Orchestrator, reported as it ends.

pytest runs items one at a time and its ``SetupState`` cannot hold resources
of items that run at once, so this replaces ``pytest_runtestloop`` (as
xdist's controller does): ordinary tests first, through the standard
protocol, then every task concurrently, each replayed through the standard
report hooks as soon as it is terminal, then the gate items and the tests
that read ``agentcompass_results``. The other two ways a task runs are in
``worker`` (an xdist worker) and ``single`` (pytest's own protocol); see
docs/how-it-works.md, "Three ways a task runs".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from ..runtime.gc_tuning import fewer_collections
from ..vocabulary.errors import AgentCompassError
from ..vocabulary.types import OrchestrationEvent, OrchestrationStatus
from .gate_items import GateItem
from .nodes import TaskItem
from .outcomes import emit_reports
from .progress import Progress

if TYPE_CHECKING:
    from ..runtime.request import RequestRuntime
    from ..vocabulary.outcome import TaskOutcome
    from .keys import RunHandle

__all__ = ["RESULTS_FIXTURE", "InProcessLoop"]

#: Ordinary tests that ask for this fixture run after the tasks.
RESULTS_FIXTURE = "agentcompass_results"


class InProcessLoop:
    """``pytest_runtestloop`` of a session without xdist (registered by the run, outside xdist workers)."""

    def __init__(self, run: RunHandle) -> None:
        self.run = run

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.config.pluginmanager.has_plugin("dsession"):
            return None  # the xdist controller runs no item: its workers do
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(
                f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} during collection"
            )
        if session.config.option.collectonly:
            return True
        tasks = [i for i in session.items if isinstance(i, TaskItem)]
        # Gate items judge finalized requests: they run after every task.
        gates = [i for i in session.items if isinstance(i, GateItem)]
        others = [i for i in session.items if not isinstance(i, TaskItem | GateItem)]
        before = [i for i in others if RESULTS_FIXTURE not in getattr(i, "fixturenames", ())]
        after = [i for i in others if RESULTS_FIXTURE in getattr(i, "fixturenames", ())]
        # Session fixtures stay up across the tasks (components may come from them).
        _run_items(session, before, next(iter(tasks or gates or after), None))
        if tasks:
            self._run_tasks(session, tasks)
            _check_stop(session)
        _run_items(session, gates, after[0] if after else None)
        _run_items(session, after, None)
        if not after:
            session._setupstate.teardown_exact(None)
        self.run.release_outcomes()
        return True

    def _run_tasks(self, session: pytest.Session, items: list[TaskItem]) -> None:
        """Every task item on one Orchestrator; each reported through the standard hooks as it ends."""
        from ..runtime.driver import TERMINATED_REASON, Terminated, drive  # the run's machinery: only now

        run = self.run
        by_key = {(i.request_name, i.task.task_id): i for i in items}
        run.items = items
        try:
            run.runtimes = states = self._runtimes(items)
        except AgentCompassError as exc:
            raise run.usage_error(exc) from None
        thresholds = {state.name: state.ctx.req.execution.pass_threshold for state in states}
        progress = self._progress()

        def on_outcome(outcome: TaskOutcome) -> None:
            item = by_key.get((outcome.request, outcome.task.task_id))
            if item is None:
                return
            progress.clear()
            run.task_finished(item, outcome)
            emit_reports(item, outcome, thresholds[outcome.request])
            if session.shouldfail or session.shouldstop:
                orchestrator.stop(str(session.shouldfail or session.shouldstop))

        def on_event(event: OrchestrationEvent, state: RequestRuntime) -> None:
            if event is OrchestrationEvent.FINALIZED:
                run.request_finalized(state)
            elif event is OrchestrationEvent.OPENED and state.resumed:
                progress.clear()
                run.say_resuming(state)

        providers = {state.ctx.req.environment.id: state.ctx.capacity for state in states}

        def on_tick() -> None:
            # "path/to/file.py:Class" ids are long: the class name is enough on one line.
            permits = {
                name.rsplit(":", 1)[-1] + (f" {p.in_use}/{p.limit}" if p.limit else f" {p.in_use}"): p.in_use
                for name, p in providers.items()
            }
            progress.tick(states, permits)

        orchestrator = run.orchestrator(
            states,
            on_outcome=on_outcome,
            on_event=on_event,
            on_tick=on_tick if progress.enabled else None,
            tick_seconds=min(progress.interval, 1.0),
            on_retry=progress.on_retry,
        )
        try:
            with run.task_output(), fewer_collections():
                run.result = drive(orchestrator)
        finally:
            progress.clear()
        if run.result.status is OrchestrationStatus.INTERRUPTED:
            # A SIGTERM is said as one in pytest's banner too (run.py's pytest_keyboard_interrupt).
            raise Terminated if run.result.reason == TERMINATED_REASON else KeyboardInterrupt

    def _runtimes(self, items: list[TaskItem]) -> list[RequestRuntime]:
        """One runtime per request that has selected items, in declaration order (pytest's item order within)."""
        wanted: dict[str, dict[str, int]] = {}
        setups = {}
        for position, item in enumerate(items):
            wanted.setdefault(item.request_name, {})[item.task.task_id] = position
            setups[item.request_name] = item.setup_info
        return [
            self.run.own_runtime(setup, set(wanted[setup.req.name]), order=wanted[setup.req.name])
            for setup in sorted(setups.values(), key=lambda s: s.index)
        ]

    def _progress(self) -> Progress:
        config = self.run.config
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        mode = config.getoption("agentcompass_progress")
        if terminal is None or config.get_verbosity() < 0:
            mode = "off"
        return Progress(terminal, mode, config.getoption("agentcompass_progress_interval"))


def _run_items(session: pytest.Session, items: Sequence[pytest.Item], last_next: pytest.Item | None) -> None:
    for index, item in enumerate(items):
        nextitem = items[index + 1] if index + 1 < len(items) else last_next
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        _check_stop(session)


def _check_stop(session: pytest.Session) -> None:
    if session.shouldfail:
        raise session.Failed(session.shouldfail)
    if session.shouldstop:
        raise session.Interrupted(session.shouldstop)
