"""A task item run by pytest's own protocol (``TaskItem.setup``): one task, alone, on its own loop.

The plugin's loops never take this path: without xdist the run's loop
(:mod:`.loop`) runs every task, and on an xdist worker the worker's loop
(:mod:`.worker`) does. It is taken only when something else runs the items
through ``pytest_runtest_protocol``: another plugin's ``pytest_runtestloop``
that runs before the plugin's own. Each task then runs alone, into the
session's run directory, with no run-wide concurrency, resume, carry-over or
summary (docs/how-it-works.md, "Three ways a task runs").
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..concurrency.threads import run_with_pool, workers_for

if TYPE_CHECKING:
    from ..runtime.request import RequestRuntime
    from ..vocabulary.outcome import TaskOutcome
    from .keys import RunHandle
    from .nodes import TaskItem

__all__ = ["run_single_task"]


async def _run_and_close(state: RequestRuntime, item: TaskItem) -> TaskOutcome:
    # Each task gets its own event loop here: what the harness holds on this
    # loop (a model client) must be closed before the loop is.
    try:
        return await state.run(item.task)
    finally:
        await state.aclose()


def run_single_task(run: RunHandle, item: TaskItem) -> TaskOutcome:
    """Run one task to its terminal outcome in this process (see the module doc)."""
    state = run.own_runtime(item.setup_info, {item.task.task_id}, resume=False)
    try:
        grace = run.orchestration.cleanup_grace_seconds
        outcome = run_with_pool(_run_and_close(state, item), max_workers=workers_for(1), grace=grace)
    except (KeyboardInterrupt, asyncio.CancelledError):
        outcome = state.cancelled_outcome(item.task, "cancelled: interrupted")
    state.store.close()
    return outcome
