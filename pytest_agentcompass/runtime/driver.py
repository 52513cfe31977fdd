"""Driving an Orchestrator on its own event loop, with two-stage Ctrl-C (no pytest here)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from ..concurrency.threads import BlockingCallPool, drain_shared_pools, grouped, use_pool, workers_for
from .orchestrator import OrchestrationResult, Orchestrator

__all__ = ["TERMINATED_REASON", "Terminated", "drive", "sigterm_interrupts", "write_stderr"]

log = logging.getLogger("pytest_agentcompass")

#: After a second Ctrl-C, how long cancelled cleanups get to unwind before they are abandoned.
STUCK_TASK_SECONDS = 1.0


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where a Ctrl-C would be: as a second Ctrl-C, it skips the cleanup grace.

    What sends SIGTERM (``timeout``, a CI job being cancelled, ``docker stop``)
    sends SIGKILL a few seconds later: a run that waited out its grace would lose
    its bookkeeping. It keeps the bookkeeping instead: unfinished tasks recorded,
    the run ``interrupted`` and unlocked, its environments removed.
    """


TERMINATED_MESSAGE = "\nagentcompass: terminated (SIGTERM); recording the run and removing its environments\n"
#: Why a run ended, in its record and its cancelled tasks' errors, when a SIGTERM ended it.
TERMINATED_REASON = "terminated by a SIGTERM"


def write_stderr(text: str) -> None:
    """Write ``text`` to stderr from a signal handler.

    ``sys.stderr.write`` there can raise "reentrant call" when the signal came
    while the main thread was writing to a buffered stderr, and what the
    handler had still to do would never happen.
    """
    with contextlib.suppress(OSError):
        os.write(2, text.encode())


@contextlib.contextmanager
def sigterm_interrupts(on_term: Callable[[], object] | None = None) -> Iterator[None]:
    """Inside, a SIGTERM calls ``on_term``, or raises :class:`Terminated`; in the main thread only.

    Outside the main thread, or where SIGTERM was ignored when the process
    started, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        yield
        return

    def on_sigterm(signum: int, frame: object) -> None:
        if on_term is not None:
            on_term()
        write_stderr(TERMINATED_MESSAGE)
        if on_term is None:
            raise Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def drive(orchestrator: Orchestrator) -> OrchestrationResult:
    """Run ``orchestrator`` on a new event loop with two-stage Ctrl-C handling.

    The first SIGINT cancels the orchestration cooperatively (cleanup within
    the grace period). The second skips the rest of the grace but not the
    bookkeeping: unfinished tasks are recorded, run directories say
    ``interrupted`` and are released, left-over Environments are swept, and
    the loop is closed without tasks dying unseen. A third raises
    ``KeyboardInterrupt`` at once. A SIGTERM counts as the first two
    (see :class:`Terminated`).
    """
    loop = asyncio.new_event_loop()
    pool = BlockingCallPool(workers_for(orchestrator.task_concurrency), grace=orchestrator.cleanup_grace_seconds)
    use_pool(loop, pool)
    main = loop.create_task(orchestrator.execute())
    interrupts = 0

    def on_sigint() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1 and orchestrator.cancel_or_force():
            sys.stderr.write("\nagentcompass: interrupted, cleaning up (press Ctrl-C again to exit at once)\n")
        elif interrupts <= 2:  # a second Ctrl-C, or a first while the deadline's cleanup waits
            interrupts = 2
            sys.stderr.write("\nagentcompass: exiting now; recording the run and removing its environments\n")
            orchestrator.force()
        else:
            raise KeyboardInterrupt

    def on_sigterm() -> None:
        nonlocal interrupts
        sys.stderr.write(TERMINATED_MESSAGE)
        if interrupts == 0:
            orchestrator.interrupt_reason = TERMINATED_REASON  # not "by the user": say what arrived
            orchestrator.cancel_or_force()
        interrupts = max(interrupts, 2)
        orchestrator.force()

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if in_main_thread else None
    previous_term = signal.getsignal(signal.SIGTERM) if in_main_thread else None
    # A process started with SIGTERM ignored keeps it so (as the SIGINT of a
    # background job is not: a run must stay interruptible).
    on_term = in_main_thread and previous_term is not signal.SIG_IGN
    if in_main_thread:
        # Through the loop, not signal.signal: the loop's wakeup fd is written
        # from the C handler, so the loop wakes even when the kernel delivered
        # SIGINT to a worker thread while the main thread sat in epoll_wait.
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    if on_term:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    forced = False
    try:
        try:
            loop.run_until_complete(main)
        except asyncio.CancelledError:
            pass
        except KeyboardInterrupt:
            forced = True
            raise
        if orchestrator.result.forced or orchestrator.result.stuck_tasks:
            # Also when the grace ran out: left pending, a task would be closed by the
            # garbage collector outside its context, its cleanup failing in odd ways.
            _drop_stuck_tasks(loop)
    finally:
        if in_main_thread:
            loop.remove_signal_handler(signal.SIGINT)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if on_term:
            loop.remove_signal_handler(signal.SIGTERM)
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)
        if forced:
            _drop_stuck_tasks(loop, wait=False)
        else:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            started = orchestrator.result.cleanup_started
            spent = 0.0 if started is None else time.monotonic() - started
            # One grace for everything cancellation waits on: async tasks first, then threads.
            left = 0.0 if orchestrator.result.forced else max(0.0, pool.grace - spent)
            ending = time.monotonic()
            pool.shutdown(wait=True, cancel_futures=True, timeout=left, notice=_say_waiting)
            # Then what cancelled tasks left in the process's shared pools (workspaces being removed).
            shared = drain_shared_pools(max(0.0, left - (time.monotonic() - ending)))
            abandoned = orchestrator.result.abandoned_calls = [*pool.abandoned, *shared]
            if abandoned:
                log.warning("blocking calls still running after the cleanup grace: %s", grouped(abandoned))
    return orchestrator.result


def _say_waiting(calls: list[str], seconds: float) -> None:
    sys.stderr.write(
        f"\nagentcompass: waiting up to {seconds:.0f} s more (cleanup_grace_seconds) for blocking calls"
        f" that ignore cancellation: {grouped(calls)}\n"
    )


def _drop_stuck_tasks(loop: asyncio.AbstractEventLoop, *, wait: bool = True) -> None:
    """Cancel the tasks a cut-short cleanup left, give them a moment, and let the rest go quietly.

    Without this, the loop's tasks are destroyed while pending when the
    process exits, and each one prints "Task was destroyed but it is pending".
    """
    stuck = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in stuck:
        task.cancel()
    if wait and stuck:
        loop.run_until_complete(asyncio.wait(stuck, timeout=STUCK_TASK_SECONDS))
    for task in stuck:
        if not task.done():
            # Deliberately abandoned (their cleanup refused to end); nothing to report twice.
            with contextlib.suppress(AttributeError):
                task._log_destroy_pending = False  # type: ignore[attr-defined]
            # And never closed: the garbage collector would throw GeneratorExit into
            # its coroutine outside its context, where its cleanup fails again, noisily.
            _keep_forever(task)


def _keep_forever(task: asyncio.Task[object]) -> None:
    """Give ``task`` a reference nothing ever drops, so that it is never finalized, not even at exit.

    A list in a module is not enough: at interpreter exit the module's globals
    are cleared, the task is freed and its coroutine closed, running the
    cleanup that refused to end after pytest's summary ("... failed inside the
    runtime", "Exception ignored in: <coroutine ...>"). The memory is the
    process's until it ends, as a thread that will not stop keeps its own.
    """
    try:
        import ctypes  # only on this rare path

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(task))
    except (ImportError, AttributeError, OSError):  # not CPython: as long as the module lives, at least
        _KEPT.append(task)


#: Where :func:`_keep_forever` keeps tasks where it cannot leak a reference.
_KEPT: list[asyncio.Task[object]] = []
