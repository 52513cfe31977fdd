"""The Orchestrator: one worker pool over all requests, in declaration order.

Three groups cooperate: an opener (each request's run, in order, pipelined), the
workers (``task_concurrency`` of them, pulling from the first opened
request with pending work), and a finalizer (each request as soon as it is
eligible). The deadline and cancellation are handled here and only here.

A *fed* orchestration is handed its tasks one by one through
:meth:`Orchestrator.submit` until :meth:`Orchestrator.close_feed` (an xdist
worker's share of a run); otherwise each request queues its own tasks when it
is open. What opening and finalizing a request's run write depends on
whether this process owns its run directory: the request's role decides that
(``ownership``), not the Orchestrator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..vocabulary.types import OrchestrationEvent, OrchestrationStatus, RequestState, TaskSpec
from .grace import close_within_grace, sweep_environments, wait_within_grace
from .request import INTERRUPTED_BY_USER, RequestRuntime
from .task import TaskOutcome

__all__ = ["OrchestrationResult", "Orchestrator", "Slots"]

#: Request preflights run at once (fetching agents' packages, building images).
PREFLIGHTS_AT_ONCE = 4

log = logging.getLogger("pytest_agentcompass")


@dataclass
class OrchestrationResult:
    """How the orchestration ended."""

    status: OrchestrationStatus = OrchestrationStatus.COMPLETED
    reason: str | None = None
    unfinished: list[TaskOutcome] = field(default_factory=list)
    stuck_tasks: int = 0
    #: Blocking calls (``asyncio.to_thread``) still running after the cleanup grace, left to daemon threads.
    abandoned_calls: list[str] = field(default_factory=list)
    #: ``time.monotonic()`` when cancellation began: the cleanup grace counts from here.
    cleanup_started: float | None = None
    #: A second Ctrl-C cut the cleanup grace short.
    forced: bool = False


class Slots(Protocol):
    """Run-wide task permits shared with other processes (``limits.RemotePermits``)."""

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


class Orchestrator:
    """Runs the tasks of several requests under one deadline.

    :param on_outcome: Called in the loop thread for every terminal task
        (new, carried over, cancelled), as soon as it is known.
    :param on_event: Called in the loop thread as each request's run is opened and finalized.
    :param on_retry: Called with ``(task id, stage)`` for every runtime retry.
    :param fed: Tasks are handed over with :meth:`submit` until :meth:`close_feed` (see the module doc).
    :param slots: Permits every running task holds, shared with other processes (run-wide ``task_concurrency``).
    """

    def __init__(
        self,
        requests: Sequence[RequestRuntime],
        *,
        task_concurrency: int,
        timeout_seconds: float | None = None,
        cleanup_grace_seconds: float = 30.0,
        on_outcome: Callable[[TaskOutcome], None] = lambda outcome: None,
        on_event: Callable[[OrchestrationEvent, RequestRuntime], None] = lambda event, state: None,
        on_tick: Callable[[], None] | None = None,
        tick_seconds: float = 1.0,
        on_retry: Callable[[str, str], None] | None = None,
        fed: bool = False,
        slots: Slots | None = None,
    ) -> None:
        self.requests = list(requests)
        if on_retry is not None:
            for state in self.requests:
                state.watch_retries(on_retry)
        self.task_concurrency = task_concurrency
        self.timeout_seconds = timeout_seconds
        self.cleanup_grace_seconds = cleanup_grace_seconds
        self.on_outcome = on_outcome
        self.on_event = on_event
        self.on_tick = on_tick
        self.tick_seconds = tick_seconds
        self.result = OrchestrationResult()
        self._stopping = False
        #: An exception raised by ``on_outcome``; re-raised once everything is finalized.
        self.observer_error: Exception | None = None
        self._dispatchable = asyncio.Event()  # a request's run was opened, or we stop
        self._changed = asyncio.Event()  # pending or active work changed
        self._forced = asyncio.Event()  # a second Ctrl-C: stop waiting for cleanups
        self.started_at = 0.0
        self.slots = slots
        # Tasks handed over by another thread (fed), and whether more may come.
        self._inbox: deque[tuple[RequestRuntime, TaskSpec]] = deque()
        self._feed_closed = not fed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[object] | None = None
        self._interrupted = False
        #: What interrupted the run, for its record and the cancelled tasks' errors (a SIGTERM says so).
        self.interrupt_reason = INTERRUPTED_BY_USER
        #: Tasks recorded as cancelled when the run stopped: an end they reach later is not reported again.
        self._given_up: set[tuple[str, str]] = set()

    # -- public --------------------------------------------------------------
    def stop(self, reason: str = "stopped") -> None:
        """Dispatch nothing more; running tasks finish normally (``-x``, ``--maxfail``)."""
        if not self._stopping:
            self._stopping = True
            self.result.status, self.result.reason = OrchestrationStatus.STOPPED, reason
        self._dispatchable.set()
        self._changed.set()

    def force(self) -> None:
        """Skip what is left of the cleanup grace (a second Ctrl-C); the bookkeeping still happens."""
        self.result.forced = True
        self._forced.set()

    # -- thread-safe entry points (fed: the pytest side runs in another thread) ----
    def submit(self, state: RequestRuntime, task: TaskSpec) -> None:
        """Hand over ``task`` of ``state`` to run; callable from any thread."""
        self._inbox.append((state, task))
        self._poke(self._drain)

    def close_feed(self) -> None:
        """No more tasks will be submitted; callable from any thread."""
        self._feed_closed = True
        self._poke(self._drain)

    def force_threadsafe(self) -> None:
        """:meth:`force` from another thread (an xdist worker's second Ctrl-C)."""
        self.result.forced = True
        self._poke(self._forced.set)

    def stop_threadsafe(self, reason: str) -> None:
        """:meth:`stop` from another thread."""
        self._poke(lambda: self.stop(reason))

    def interrupt(self, reason: str | None = None) -> None:
        """Cancel like a first Ctrl-C (cleanup within the grace); callable from any thread.

        Idempotent: one Ctrl-C may arrive twice under xdist (the signal, and the controller's word).
        What it does is decided by :meth:`cancel_or_force` in the loop thread, where cleanups start.
        ``reason``: what arrived, when it was not a Ctrl-C (the first interrupt's reason stands).
        """
        if self._interrupted:
            return
        if reason:
            self.interrupt_reason = reason
        self._interrupted = True
        self._poke(self.cancel_or_force)

    def cancel_or_force(self) -> bool:
        """In the loop thread: cancel the orchestration as a first Ctrl-C does; True if it did.

        Once a cleanup has started (the deadline's, or an earlier cancellation's) it forces
        instead: a cancellation thrown into that cleanup would cut it short before it records
        the unfinished tasks and releases the run.
        """
        if self.result.cleanup_started is None:
            if self._main is None:  # not started yet: execute() ends as soon as it does
                self._interrupted = True
            else:
                self._main.cancel()
            return True
        self.force()
        return False

    def _poke(self, callback: Callable[[], object]) -> None:
        loop = self._loop
        if loop is not None:  # before execute() starts, it drains the inbox itself
            try:
                loop.call_soon_threadsafe(callback)
            except RuntimeError:  # the loop is closed: nothing runs any more
                pass

    def _drain(self) -> None:
        """Move submitted tasks to their request's queue (in the loop thread)."""
        while self._inbox:
            state, task = self._inbox.popleft()
            outcome = state.accept(task)
            if outcome is not None:  # recorded (resumed or carried over), or its request failed: reported, not run
                self._notify(outcome)
        self._dispatchable.set()
        self._changed.set()

    async def execute(self) -> OrchestrationResult:
        """Preflight every request, then run everything under the deadline.

        Once it returns (or raises), no request records anything more: a plan an
        abandoned attempt makes later is dropped.
        """
        try:
            return await self._execute()
        finally:
            for state in self.requests:
                state.store.close()

    async def _execute(self) -> OrchestrationResult:
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        if self._interrupted:
            raise asyncio.CancelledError
        try:
            await self._preflights()
        except asyncio.CancelledError:  # Ctrl-C while a preflight waits: every task is cancelled, and recorded
            for state in self.requests:
                if state.failed is not None and not state.finalized:
                    # Its own preflight failed before the Ctrl-C: reported and recorded as such.
                    self._notify_all(state.fail_unrun())
                    state.close_failed()
            await self._cancel_remaining([], OrchestrationStatus.INTERRUPTED, self.interrupt_reason)
            raise
        self.started_at = time.monotonic()
        tasks = [asyncio.ensure_future(self._open_runs_in_order())]
        # Never more workers than tasks, each takes one at a time (a task_concurrency of a
        # billion started a billion coroutines for three tasks, and hung).
        workers = min(self.task_concurrency, max(1, sum(len(state.tasks) for state in self.requests)))
        tasks += [asyncio.ensure_future(self._worker()) for _ in range(workers)]
        tasks.append(asyncio.ensure_future(self._finalize_ready()))
        self._drain()
        ticker = asyncio.ensure_future(self._tick()) if self.on_tick else None
        try:
            try:
                done, _ = await asyncio.wait(tasks, timeout=self.timeout_seconds)
            except asyncio.CancelledError:
                await self._cancel_remaining(tasks, OrchestrationStatus.INTERRUPTED, self.interrupt_reason)
                raise
            finally:
                if ticker is not None:
                    ticker.cancel()
            if len(done) < len(tasks):
                reason = f"orchestration timeout of {self.timeout_seconds}s reached"
                await self._cancel_remaining(tasks, OrchestrationStatus.TIMEOUT, reason)
            else:
                for task in done:
                    task.result()  # surface a bug in the orchestrator itself
        finally:
            await self._close_requests()
        if self.observer_error is not None:
            raise self.observer_error
        return self.result

    async def _preflights(self) -> None:
        """Every request's preflight, a few at once: each may fetch an agent's packages or build an image,
        and one after the other a run of five agents waited for five downloads in a row."""
        limit = asyncio.Semaphore(PREFLIGHTS_AT_ONCE)

        async def one(state: RequestRuntime) -> None:
            async with limit:
                await state.preflight()

        tasks = [asyncio.ensure_future(one(state)) for state in self.requests]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # a Ctrl-C: none goes on alone
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _close_requests(self) -> None:
        """Close what each request's harness shares, within what is left of the grace."""
        grace = self.cleanup_grace_seconds
        if self.result.cleanup_started is not None:
            grace = max(0.1, grace - (time.monotonic() - self.result.cleanup_started))
        if not await close_within_grace(self.requests, grace, self._forced):
            self.result.stuck_tasks += 1  # the driver lets it go quietly

    async def _tick(self) -> None:
        assert self.on_tick is not None
        while True:
            await asyncio.sleep(self.tick_seconds)
            self.on_tick()

    # -- the three groups --------------------------------------------------------
    async def _open_runs_in_order(self) -> None:
        # Every sweep first, before any task runs: requests resumed together share their run
        # id, and a later request's sweep removed what an earlier one was running.
        for state in self.requests:
            if state.failed is None and not self._stopping:
                await state.sweep()
        for index, state in enumerate(self.requests):
            # Pipelining: start the next request only when the earlier ones
            # would soon leave workers idle.
            while not self._stopping and sum(len(s.pending) for s in self.requests[:index]) >= self.task_concurrency:
                await self._wait(self._changed)
            if self._stopping:
                return
            if state.failed is None:  # else its preflight failed
                self.on_event(OrchestrationEvent.OPEN, state)
                taken = await state.open_run()
                if state.failed is None:
                    self.on_event(OrchestrationEvent.OPENED, state)
                self._notify_all(taken)
            if state.failed is not None:
                self._notify_all(state.fail_unrun())
            self._dispatchable.set()
            self._changed.set()

    async def _worker(self) -> None:
        while True:
            if self._inbox:
                self._drain()
            state = self._select_state()
            if state is None:
                if self._stopping or (self._feed_closed and all(s.opened for s in self.requests)):
                    return
                await self._wait(self._dispatchable)
                continue
            if self.slots is not None:
                try:
                    await self.slots.acquire()
                except ConnectionError as exc:  # the run-wide permits went with the process serving them
                    self.stop(str(exc))
                    return
                state = self._select_state()  # others may have taken the work meanwhile
                if state is None:
                    self.slots.release()
                    continue
            task = state.next_task()
            self._changed.set()
            try:
                outcome = await state.run(task)
            finally:
                self._changed.set()
                if self.slots is not None:
                    self.slots.release()
            if (state.name, task.task_id) in self._given_up:
                continue  # ended after the grace: already reported as cancelled, once is enough
            self._notify(outcome)

    def _notify(self, outcome: TaskOutcome) -> None:
        """Hand ``outcome`` to the observer; if the observer breaks, stop cleanly and re-raise at the end."""
        if self.observer_error is not None:
            return
        try:
            self.on_outcome(outcome)
        except Exception as exc:
            self.observer_error = exc
            self.stop(f"reporting failed: {type(exc).__name__}: {exc}")
        outcome.slim()  # reported: keep only what counts and summaries need

    def _notify_all(self, outcomes: Sequence[TaskOutcome]) -> None:
        for outcome in outcomes:
            self._notify(outcome)

    def _select_state(self) -> RequestRuntime | None:
        """The first request whose run is open, in declaration order, with pending tasks."""
        if self._stopping:
            return None
        for state in self.requests:
            if state.opened and state.pending:
                return state
        return None

    async def _finalize_ready(self) -> None:
        while True:
            for index, state in enumerate(self.requests):
                if state.finalized or not state.opened or not state.drained:
                    continue
                if not self._stopping and (
                    not self._feed_closed or any(s.pending or not s.opened for s in self.requests[:index])
                ):
                    continue  # more of its tasks may come, or an earlier request is not done dispatching
                await self._finalize(state)
            if all(s.finalized for s in self.requests):
                return
            if self._stopping and all(not s.active for s in self.requests):
                # Nothing more will run: close what is left (a request with tasks never dispatched).
                for state in self.requests:
                    if state.finalized:
                        continue
                    if state.opened:
                        await self._finalize(state)
                    else:  # never opened: its run directory still says so, and is resumable
                        state.close_unopened(self.result.reason or "stopped")
                return
            await self._wait(self._changed)

    async def _finalize(self, state: RequestRuntime) -> None:
        if state.failed is not None:
            state.close_failed()
            return
        self.on_event(OrchestrationEvent.FINALIZE, state)
        await state.finalize(RequestState.STOPPED if self._stopping else RequestState.COMPLETED)
        self.on_event(OrchestrationEvent.FINALIZED, state)

    async def _wait(self, event: asyncio.Event) -> None:
        await event.wait()
        event.clear()

    # -- deadline and cancellation ---------------------------------------------------
    async def _cancel_remaining(
        self, tasks: Sequence[asyncio.Future[None]], status: OrchestrationStatus, reason: str
    ) -> None:
        """Freeze the status, cancel everything, wait within the grace, persist what is unfinished."""
        self.result.status, self.result.reason = status, reason
        self.result.cleanup_started = time.monotonic()
        self._stopping = True
        running = {state.name: list(state.active.values()) for state in self.requests}
        for future in tasks:
            future.cancel()
        still = await wait_within_grace(tasks, self.cleanup_grace_seconds, self._forced)
        self.result.stuck_tasks = len(still)
        if still:
            why = "a second Ctrl-C cut the cleanup short" if self.result.forced else "the cleanup grace ran out"
            log.warning("%d orchestration task(s) did not stop: %s", len(still), why)
        self._drain()  # what was handed over and not yet queued is unfinished too
        for state in self.requests:
            cancelled = state.cancel_unfinished(status, reason, running[state.name])
            self._given_up.update((state.name, outcome.task.task_id) for outcome in cancelled)
            self.result.unfinished += cancelled
        if still:
            await sweep_environments(self.requests)
        self._notify_all(self.result.unfinished)
