"""Driving an Orchestrator on its own event loop, with two-stage Ctrl-C (no pytest here)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time

from .orchestrator import OrchestrationResult, Orchestrator
from .threads import BlockingCallPool, workers_for

__all__ = ["drive"]

log = logging.getLogger("pytest_agentcompass")


def drive(orchestrator: Orchestrator) -> OrchestrationResult:
    """Run ``orchestrator`` on a new event loop with two-stage Ctrl-C handling.

    The first SIGINT cancels the orchestration cooperatively (cleanup within
    the grace period); a second one raises ``KeyboardInterrupt`` at once.
    """
    loop = asyncio.new_event_loop()
    pool = BlockingCallPool(workers_for(orchestrator.task_concurrency), grace=orchestrator.cleanup_grace_seconds)
    loop.set_default_executor(pool)
    main = loop.create_task(orchestrator.execute())
    interrupts = 0

    def on_sigint() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            sys.stderr.write("\nagentcompass: interrupted, cleaning up (press Ctrl-C again to exit at once)\n")
            main.cancel()
        else:
            raise KeyboardInterrupt

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if in_main_thread else None
    if in_main_thread:
        # Through the loop, not signal.signal: the loop's wakeup fd is written
        # from the C handler, so the loop wakes even when the kernel delivered
        # SIGINT to a worker thread while the main thread sat in epoll_wait.
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    forced = False
    try:
        try:
            loop.run_until_complete(main)
        except asyncio.CancelledError:
            pass
        except KeyboardInterrupt:
            forced = True
            raise
    finally:
        if in_main_thread:
            loop.remove_signal_handler(signal.SIGINT)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if not forced:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            started = orchestrator.result.cleanup_started
            spent = 0.0 if started is None else time.monotonic() - started
            # One grace for everything cancellation waits on: async tasks first, then threads.
            pool.shutdown(wait=True, cancel_futures=True, timeout=max(0.0, pool.grace - spent))
            orchestrator.result.abandoned_calls = pool.abandoned
            if pool.abandoned:
                log.warning("blocking calls still running after the cleanup grace: %s", ", ".join(pool.abandoned))
    return orchestrator.result
