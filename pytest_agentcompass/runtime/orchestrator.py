"""The Orchestrator: one worker pool over all requests, in declaration order.

Three groups cooperate: a preparer (requests in order, pipelined), the
workers (``task_concurrency`` of them, pulling from the first prepared
request with pending work), and a finalizer (each request as soon as it is
eligible). The deadline and cancellation are handled here and only here.

A *shared* orchestration runs one process's share of a run that several
processes run together (pytest-xdist workers): tasks arrive through
:meth:`Orchestrator.submit` until :meth:`Orchestrator.close_feed`, each
running task holds one of the run-wide ``slots``, and preparing and
finalizing the run directories is left to the process that owns them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import PreflightError
from ..types import TaskSpec
from .request import RequestRuntime
from .task import TaskOutcome

__all__ = ["OrchestrationResult", "Orchestrator", "Slots", "not_run"]

#: How long removing left-over Environments may take after the cleanup was cut short.
SWEEP_SECONDS = 20.0

log = logging.getLogger("pytest_agentcompass")


@dataclass
class OrchestrationResult:
    """How the orchestration ended."""

    status: str = "completed"  # completed | stopped | timeout | interrupted
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
        (new, reused, cancelled), as soon as it is known.
    :param shared: This process runs a share of the run (see the module doc).
    :param slots: Permits every running task holds, shared with the other processes.
    """

    def __init__(
        self,
        requests: Sequence[RequestRuntime],
        *,
        task_concurrency: int,
        timeout_seconds: float | None = None,
        cleanup_grace_seconds: float = 30.0,
        on_outcome: Callable[[TaskOutcome], None] = lambda outcome: None,
        on_event: Callable[[str, RequestRuntime], None] = lambda event, state: None,
        on_tick: Callable[[], None] | None = None,
        tick_seconds: float = 1.0,
        shared: bool = False,
        slots: Slots | None = None,
    ) -> None:
        self.requests = list(requests)
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
        self._dispatchable = asyncio.Event()  # a request was prepared, or we stop
        self._changed = asyncio.Event()  # pending or active work changed
        self._forced = asyncio.Event()  # a second Ctrl-C: stop waiting for cleanups
        self._failed_how: dict[str, str] = {}  # request -> what failed, for the tasks' message
        self.started_at = 0.0
        self.shared = shared
        self.slots = slots
        # Shared mode: tasks handed over by another thread, and whether more may come.
        self._inbox: deque[tuple[RequestRuntime, TaskSpec]] = deque()
        self._feed_closed = not shared
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[object] | None = None
        self._interrupted = False
        #: What interrupted the run, for its record and the cancelled tasks' errors (a SIGTERM says so).
        self.interrupt_reason = "interrupted by the user"
        #: Tasks recorded as cancelled when the run stopped: an end they reach later is not reported again.
        self._given_up: set[tuple[str, str]] = set()

    # -- public --------------------------------------------------------------
    def stop(self, reason: str = "stopped") -> None:
        """Dispatch nothing more; running tasks finish normally (``-x``, ``--maxfail``)."""
        if not self._stopping:
            self._stopping = True
            self.result.status, self.result.reason = "stopped", reason
        self._dispatchable.set()
        self._changed.set()

    def force(self) -> None:
        """Skip what is left of the cleanup grace (a second Ctrl-C); the bookkeeping still happens."""
        self.result.forced = True
        self._forced.set()

    # -- thread-safe entry points (shared mode: the pytest side runs in another thread) ----
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
            recorded = state.recorded(task)
            if recorded is not None:  # resumed or reused: report, do not run
                state.outcomes[task.task_id] = recorded
                self._notify(recorded)
            elif state.failed is not None:  # a shared run's task that came after its request failed
                self._fail_task(state, task, self._failed_how.get(state.name, "failed its preflight"))
            else:
                state.pending.append(task)
        self._dispatchable.set()
        self._changed.set()

    async def execute(self) -> OrchestrationResult:
        """Preflight every request, then run everything under the deadline."""
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        if self._interrupted:
            raise asyncio.CancelledError
        try:
            for state in self.requests:
                try:
                    await state.preflight()
                except PreflightError as exc:
                    state.failed = str(exc)
                    state.prepared = True
        except asyncio.CancelledError:  # Ctrl-C while a preflight waits: every task is cancelled, and recorded
            for state in self.requests:
                if state.failed is not None and not state.finalized and not self.shared:
                    # Its own preflight failed before the Ctrl-C: reported and recorded as such.
                    self._fail_request(state, "failed its preflight")
                    self._close_failed(state)
            await self._cancel_remaining([], "interrupted", self.interrupt_reason)
            raise
        self.started_at = time.monotonic()
        tasks = [asyncio.ensure_future(self._prepare_in_order())]
        # Never more workers than tasks, each takes one at a time (a task_concurrency of a
        # billion started a billion coroutines for three tasks, and hung).
        workers = min(self.task_concurrency, max(1, sum(len(state.tasks) for state in self.requests)))
        tasks += [asyncio.ensure_future(self._worker()) for _ in range(workers)]
        if not self.shared:  # a shared run is finalized by the process that owns it
            tasks.append(asyncio.ensure_future(self._finalize_ready()))
        self._drain()
        ticker = asyncio.ensure_future(self._tick()) if self.on_tick else None
        try:
            try:
                done, _ = await asyncio.wait(tasks, timeout=self.timeout_seconds)
            except asyncio.CancelledError:
                await self._cancel_remaining(tasks, "interrupted", self.interrupt_reason)
                raise
            finally:
                if ticker is not None:
                    ticker.cancel()
            if len(done) < len(tasks):
                reason = f"orchestration timeout of {self.timeout_seconds}s reached"
                await self._cancel_remaining(tasks, "timeout", reason)
            else:
                for task in done:
                    task.result()  # surface a bug in the orchestrator itself
        finally:
            await self._close_requests()
        if self.observer_error is not None:
            raise self.observer_error
        return self.result

    async def _close_requests(self) -> None:
        """Close what each request's harness shares (model clients), within what is left of the grace."""
        grace = self.cleanup_grace_seconds
        if self.result.cleanup_started is not None:
            grace = max(0.1, grace - (time.monotonic() - self.result.cleanup_started))
        closing: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(s.aclose() for s in self.requests)))
        forced: asyncio.Future[Any] = asyncio.ensure_future(self._forced.wait())  # a 2nd Ctrl-C, a SIGTERM
        try:
            await asyncio.wait({closing, forced}, timeout=grace or None, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
        if not closing.done():
            closing.cancel()
            why = "a second Ctrl-C cut it short" if self.result.forced else "it took longer than the cleanup grace"
            log.warning("closing the harnesses was abandoned: %s", why)
            await asyncio.wait({closing}, timeout=1.0)  # let the cancellation land
            if not closing.done():
                self.result.stuck_tasks += 1  # the driver lets it go quietly

    async def _tick(self) -> None:
        assert self.on_tick is not None
        while True:
            await asyncio.sleep(self.tick_seconds)
            self.on_tick()

    # -- the three groups --------------------------------------------------------
    async def _prepare_in_order(self) -> None:
        for index, state in enumerate(self.requests):
            # Pipelining: start the next request only when the earlier ones
            # would soon leave workers idle.
            while not self._stopping and sum(len(s.pending) for s in self.requests[:index]) >= self.task_concurrency:
                await self._wait(self._changed)
            if self._stopping:
                return
            if state.failed is not None:
                self._fail_request(state, "failed its preflight")
            else:
                self.on_event("prepare", state)
                try:
                    taken = await state.prepare()
                except Exception as exc:  # a broken request fails alone
                    log.error("request %s: preparation failed: %s", state.name, exc)
                    state.failed = f"request {state.name!r}: preparation failed: {type(exc).__name__}: {exc}"
                    state.prepared = True
                    self._fail_request(state, "could not be prepared")
                    taken = []
                if state.prepared and state.failed is None:
                    self.on_event("prepared", state)
                for outcome in taken:
                    self._notify(outcome)
            self._dispatchable.set()
            self._changed.set()

    def _fail_request(self, state: RequestRuntime, what: str) -> None:
        self._failed_how[state.name] = what
        # A shared run fails only what was handed over here; other processes hold the rest.
        handed = [t.task_id for t in state.pending] if self.shared else state.wanted
        state.pending.clear()
        for task in state.tasks:
            if task.task_id in handed and task.task_id not in state.outcomes:
                self._fail_task(state, task, what)

    def _fail_task(self, state: RequestRuntime, task: TaskSpec, what: str) -> None:
        self._notify(not_run(state, task, what))

    async def _worker(self) -> None:
        while True:
            if self._inbox:
                self._drain()
            state = self._select_state()
            if state is None:
                if self._stopping or (self._feed_closed and all(s.prepared for s in self.requests)):
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
            task = state.pending.popleft()
            state.active[task.task_id] = task
            self._changed.set()
            try:
                outcome = await state.run(task)
            except Exception as exc:  # a bug below must cost one task, not the worker
                log.exception("task %s of request %s failed inside the runtime", task.task_id, state.name)
                outcome = state.error_outcome(task, f"internal error: {type(exc).__name__}: {exc}")
                state.outcomes[task.task_id] = outcome
            finally:
                state.active.pop(task.task_id, None)
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

    def _select_state(self) -> RequestRuntime | None:
        """The first prepared request, in declaration order, with pending tasks."""
        if self._stopping:
            return None
        for state in self.requests:
            if state.prepared and state.pending:
                return state
        return None

    async def _finalize_ready(self) -> None:
        while True:
            for index, state in enumerate(self.requests):
                if state.finalized or not state.prepared or not state.drained:
                    continue
                if any(s.pending or not s.prepared for s in self.requests[:index]) and not self._stopping:
                    continue
                if state.failed is not None:
                    self._close_failed(state)
                    continue
                self.on_event("finalize", state)
                await state.finalize("stopped" if self._stopping else "completed")
                self.on_event("finalized", state)
            if all(s.finalized for s in self.requests):
                return
            if self._stopping and all(not s.active for s in self.requests):
                # Nothing more will run: close what never prepared.
                for state in self.requests:
                    if not state.finalized:
                        if state.prepared and state.failed is None:
                            await state.finalize("stopped")
                        elif state.failed is not None:
                            state.stop("failed", state.failed)
                        else:  # never prepared: its run directory still says so, and is resumable
                            state.stop("stopped", self.result.reason or "stopped")
                        state.finalized = True
                return
            await self._wait(self._changed)

    @staticmethod
    def _close_failed(state: RequestRuntime) -> None:
        """A request that failed before running: its run directory records why, and is given back."""
        assert state.failed is not None
        state.stop("failed", state.failed)
        state.finalized = True

    async def _wait(self, event: asyncio.Event) -> None:
        await event.wait()
        event.clear()

    # -- deadline and cancellation ---------------------------------------------------
    async def _cancel_remaining(self, tasks: Sequence[asyncio.Future[None]], status: str, reason: str) -> None:
        """Freeze the status, cancel everything, wait within the grace, persist what is unfinished."""
        self.result.status, self.result.reason = status, reason
        self.result.cleanup_started = time.monotonic()
        self._stopping = True
        active: list[tuple[RequestRuntime, TaskSpec]] = [
            (state, task) for state in self.requests for task in state.active.values()
        ]
        for future in tasks:
            future.cancel()
        still = await self._wait_within_grace(tasks)
        self.result.stuck_tasks = len(still)
        if still:
            why = "a second Ctrl-C cut the cleanup short" if self.result.forced else "the cleanup grace ran out"
            log.warning("%d orchestration task(s) did not stop: %s", len(still), why)
        if self.shared:  # what was handed over and not yet queued is unfinished too
            while self._inbox:
                state, task = self._inbox.popleft()
                state.pending.append(task)
        for state in self.requests:
            if state.prepared or self.shared:
                unfinished = [*state.pending, *(t for s, t in active if s is state)]
            else:
                unfinished = [t for t in state.tasks if t.task_id in state.wanted]
            for task in unfinished:
                self._given_up.add((state.name, task.task_id))
                outcome = state.cancelled_outcome(task, reason if status == "interrupted" else f"{status}: {reason}")
                state.outcomes[task.task_id] = outcome  # counted: a cancelled task is an error, not nothing
                self.result.unfinished.append(outcome)
            # Prepared or not (a Ctrl-C during the preflights): the run directory says how it ended.
            if not state.finalized and state.failed is None and not self.shared:
                state.stop(status, reason)
                state.finalized = True
        if still:
            await self._sweep()
        for outcome in self.result.unfinished:
            self._notify(outcome)

    async def _wait_within_grace(self, tasks: Sequence[asyncio.Future[None]]) -> set[asyncio.Future[Any]]:
        """Wait for ``tasks`` until they are done, the grace is over, or :meth:`force` is called."""
        pending: set[asyncio.Future[Any]] = set(tasks)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cleanup_grace_seconds if self.cleanup_grace_seconds else None
        forced: asyncio.Future[Any] = asyncio.ensure_future(self._forced.wait())
        try:
            while pending and not self._forced.is_set():
                timeout = None if deadline is None else deadline - loop.time()
                if timeout is not None and timeout <= 0:
                    break
                done, _ = await asyncio.wait({*pending, forced}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                pending -= done
        finally:
            forced.cancel()
        return pending

    async def _sweep(self) -> None:
        """Remove the Environments of this run that cleanups left open (they did not finish in time)."""
        for state in self.requests:
            try:
                async with asyncio.timeout(SWEEP_SECONDS):
                    await state.ctx.provider.sweep(state.ctx.run_id)
            except Exception as exc:  # a bounded best effort: the next run sweeps again
                log.warning("request %s: removing this run's environments failed: %s", state.name, exc)


def not_run(state: RequestRuntime, task: TaskSpec, what: str) -> TaskOutcome:
    """Record ``task`` as not run because its request ``what`` (e.g. "failed its preflight").

    The reason itself is printed once, in the summary (``state.failed``); each task points there.
    """
    message = f"not run: request {state.name!r} {what} (the reason is in the agentcompass summary)"
    outcome = state.error_outcome(task, message, state.failed_status)
    outcome.not_run_reason = state.failed
    state.outcomes[task.task_id] = outcome
    return outcome
