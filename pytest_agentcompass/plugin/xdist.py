"""Running under pytest-xdist (``-n``).

xdist workers run one item at a time through the standard protocol, so each
worker runs a task inside ``TaskItem.setup`` and writes its detail into one
run directory shared by all workers (its name comes from the controller).
The controller collects nothing; when the session ends it finalizes each
request from the details on disk: ``summary.json``, ``run_info.json`` and the
terminal summary.

Limits: provider capacity and open rate are per process, so with ``-n N`` at
most N attempts run at once across the workers; resume and reuse apply to the
in-process loop only.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from ..runtime.request import RequestRuntime
from ..runtime.task import TaskOutcome, outcome_from_detail
from ..runtime.threads import run_with_pool, workers_for

if TYPE_CHECKING:
    from ..types import TaskSpec
    from .keys import RunHandle
    from .nodes import TaskItem

__all__ = ["DistributedRun", "run_single_task"]


class DistributedRun:
    """Hooks that only exist while xdist is in use; registered by the run in ``pytest_configure``."""

    def __init__(self, run: RunHandle) -> None:
        self.run = run
        self.worker_states: dict[str, RequestRuntime] = {}
        #: Gate items the workers selected and left to the controller: node id -> file.
        self.gates: dict[str, str] = {}
        self.finalized = False

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["agentcompass_run_id"] = self.run.run_id

    def state_for(self, item: TaskItem) -> RequestRuntime:
        """The worker's runtime of ``item``'s request, created once per worker."""
        name = item.request_name
        if name not in self.worker_states:
            setup = item.setup_info
            self.worker_states[name] = self.run.runtime(
                setup, {t.task_id for t in setup.tasks}, resume=False, shared=True
            )
        return self.worker_states[name]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        from .gates import WORKER_GATES

        for nodeid, fspath, _ in getattr(node, "workeroutput", {}).get(WORKER_GATES, ()):
            self.gates[nodeid] = fspath

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        result = yield
        if not self.run.is_worker:
            # Finalize here, not at session end: the gate items' reports must
            # count in the exit code, which pytest computes after this loop.
            self._finalize_all()
            from .gates import report_gate

            # xdist counted the items the workers kept: the gates come on top.
            session.testscollected += len(self.gates)
            for nodeid, fspath in self.gates.items():
                report_gate(session.config, self.run, nodeid, fspath)
        return result

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.run.is_worker:
            for state in self.worker_states.values():
                state.store.close()
            return
        # Ctrl-C: what the workers finished is kept, and the run stays resumable.
        self._finalize_all(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)

    def _finalize_all(self, interrupted: bool = False) -> None:
        if self.finalized:
            return
        self.finalized = True
        self.run.runtimes = [
            state
            for state in (self._finalize(i, interrupted) for i in range(len(self.run.orchestration.requests)))
            if state is not None
        ]

    def _finalize(self, index: int, interrupted: bool = False) -> RequestRuntime | None:
        """Aggregate one request from the details the workers wrote."""
        run = self.run
        req = run.orchestration.requests[index]
        if not (run.loaded.output_root / req.name / run.run_id).is_dir():
            return None  # no worker ran a task of this request
        setup = run.build(index, req)
        state = run.runtime(setup, set(), resume=False, shared=True)
        by_id = {t.task_id: t for t in setup.tasks}
        for detail in state.store.iter_details():
            task = by_id.get(str(detail.get("task_id")))
            if task is not None:
                outcome = outcome_from_detail(req.name, task, detail, state.store.detail_path(task.task_id))
                outcome.reused = False
                state.outcomes[task.task_id] = outcome
                state.wanted.add(task.task_id)
        state.prepared = True
        if interrupted:
            # The controller does not know which items were selected: every task without a record is unfinished.
            state.wanted = {t.task_id for t in setup.tasks}
            state.stop("interrupted", "interrupted by the user")
            return state
        asyncio.run(state.finalize())
        run.request_finalized(state)
        return state


async def _run_and_close(state: RequestRuntime, task: TaskSpec) -> TaskOutcome:
    # Each task gets its own event loop here: what the harness holds on this
    # loop (a model client) must be closed before the loop is.
    try:
        return await state.run(task)
    finally:
        await state.aclose()


def run_single_task(run: RunHandle, item: TaskItem) -> TaskOutcome:
    """Run one task to its terminal outcome, in this process (an xdist worker)."""
    distributed = run.distributed
    if isinstance(distributed, DistributedRun):
        state = distributed.state_for(item)
    else:  # the standard protocol without xdist (another plugin replaced our loop)
        state = run.runtime(item.setup_info, {item.task.task_id}, resume=False)
    try:
        grace = run.orchestration.cleanup_grace_seconds
        outcome = run_with_pool(_run_and_close(state, item.task), max_workers=workers_for(1), grace=grace)
    except (KeyboardInterrupt, asyncio.CancelledError):
        outcome = state.cancelled_outcome(item.task, "interrupted by the user")
    if not isinstance(distributed, DistributedRun):
        state.store.close()
    return outcome
