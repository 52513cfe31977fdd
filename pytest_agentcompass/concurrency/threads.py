"""The executor behind ``asyncio.to_thread`` while the plugin's loop runs.

Provider SDKs (Docker's among them) block, so providers call them through
``asyncio.to_thread``. The loop's stock default executor has ``cpu + 4``
workers, which caps a 500-task run at a handful of concurrent container
calls, and its threads are joined at interpreter exit, so one hung SDK call
hangs pytest after the run. This pool grows with the run's concurrency,
remembers what is in flight, waits for it within the cleanup grace, and then
abandons what is still running on daemon threads, saying which calls they were.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from ..vocabulary.types import USER_MODULE_PREFIX

__all__ = [
    "BlockingCallPool",
    "grouped",
    "drain_shared_pools",
    "pool_of",
    "run_with_pool",
    "shared_pool",
    "use_pool",
    "workers_for",
]

P = ParamSpec("P")

log = logging.getLogger("pytest_agentcompass")

#: How long an idle worker waits for the next call before it exits.
IDLE_SECONDS = 2.0
#: At most this many abandoned calls get a thread beyond a pool's size (:meth:`BlockingCallPool.abandon`).
MAX_ABANDONED = 256
T = TypeVar("T")


def _describe(fn: Callable[..., Any]) -> str:
    inner: Any = fn
    if isinstance(inner, functools.partial):
        # asyncio.to_thread submits partial(context.run, func, ...): name func.
        if isinstance(getattr(inner.func, "__self__", None), contextvars.Context) and inner.args:
            inner = inner.args[0]
        else:
            inner = inner.func
    name = getattr(inner, "__qualname__", None) or type(inner).__name__
    module = getattr(inner, "__module__", None)
    if not module or module.startswith(USER_MODULE_PREFIX):  # a benchmark file's: its import name says nothing
        return name
    return f"{module}.{name}"


def grouped(calls: list[str]) -> str:
    """``calls`` (names, one per call) as a user reads them: each name once, with how many."""
    counts = collections.Counter(calls)
    return ", ".join(f"{name} ({n} calls)" if n > 1 else name for name, n in counts.items())


#: How long a pool's shutdown waits in silence before it says what it waits for.
NOTICE_AFTER = 1.0


def workers_for(task_concurrency: int) -> int:
    """Threads a run may need: a Docker exec holds one while it streams, and each task makes a few calls."""
    return max(16, 4 * task_concurrency)


class BlockingCallPool(ThreadPoolExecutor):
    """Daemon worker threads, started on demand up to ``max_workers``; idle ones exit.

    A ``ThreadPoolExecutor`` only because ``loop.set_default_executor``
    accepts nothing else; none of the base class's threads are ever started.

    :param grace: How long :meth:`shutdown` with ``wait=True`` waits for
        calls in flight before it abandons them (listed in :attr:`abandoned`).
    """

    def __init__(self, max_workers: int, grace: float, name: str = "agentcompass-io") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=name)
        self.grace = grace
        #: Calls still running when a waiting shutdown gave up on them.
        self.abandoned: list[str] = []
        #: Threads started so far (a worker that idles past its linger exits; a later burst starts new ones).
        self.started = 0
        #: Running calls no one waits for any more (:meth:`abandon`): they do not count against ``max_workers``.
        self._given_up: set[Future[Any] | LoopCall] = set()
        self._said_full = False
        # Each call keeps the function it was given: named only when someone asks (rarely).
        self._queue: deque[tuple[Future[Any] | LoopCall, Callable[[], Any], Callable[..., Any]]] = deque()
        self._running: dict[Future[Any] | LoopCall, Callable[..., Any]] = {}
        #: Per loop, what hands the outcomes of :meth:`call_for` calls over to it.
        self._settlers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Settler] = weakref.WeakKeyDictionary()
        self._workers = 0
        self._idle = 0
        self._busy = 0  # workers inside a call
        self._closed = False
        self._draining = 0  # callers waiting in drain() or shutdown()
        lock = threading.Lock()
        # Two conditions on one lock: a finished call wakes a waiting shutdown,
        # never the idle workers (woken for nothing, they used to exit and be
        # started again by the next burst: hundreds of threads per 1,000 tasks).
        self._lock = threading.Condition(lock)
        self._drained = threading.Condition(lock)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        self._enqueue(future, lambda: fn(*args, **kwargs), fn)
        return future

    def call_for(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> LoopCall:
        """Run ``fn`` in a worker; its outcome settles :attr:`LoopCall.waiter`, a future of ``loop``.

        What :meth:`submit` and a done callback would do, without a
        ``concurrent.futures.Future`` (its condition, its locks, its
        callbacks), and with one wake-up of ``loop`` for every call that
        finished since its last one, not one each.
        """
        settler = self._settlers.get(loop)
        if settler is None:
            settler = self._settlers[loop] = _Settler(loop)
        call = LoopCall(loop.create_future(), settler, fn)
        self._enqueue(call, fn, fn)
        return call

    def _enqueue(self, future: Future[Any] | LoopCall, call: Callable[[], Any], fn: Callable[..., Any]) -> None:
        """Queue ``call`` (``fn``, for its name) with what settles its outcome, and wake or start a worker."""
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._queue.append((future, call, fn))
            if self._idle:
                self._lock.notify()
            # A call must not wait behind one that blocks: with every worker
            # inside a call, a new one starts (and see _work). Not one per
            # queued call: quick calls queue while a worker waits for the GIL
            # the loop holds, and a thread each made every hand-off dearer
            # (tens of threads taking turns: 2x the CPU of a hop, measured).
            if self._workers == self._busy:
                self._start_worker()

    def abandon(self, call: Future[Any] | LoopCall) -> None:
        """No one waits for ``call`` any more (its stage timed out) though it still runs: until it ends
        it does not count against ``max_workers``, so the calls queued behind it get a thread. Without
        this, as many hung sync calls as the pool has threads failed every other task's stage."""
        with self._lock:
            if call not in self._running or call in self._given_up:
                return  # ended meanwhile, or said already
            if len(self._given_up) >= MAX_ABANDONED:  # a thread each, not without end: the host's limit
                if not self._said_full:
                    self._said_full = True
                    log.warning(
                        "%d calls that outlived their timeout still hold threads: later calls wait for one of "
                        "them to end (their stages may time out waiting)",
                        len(self._given_up),
                    )
                return
            self._given_up.add(call)
            self._max_workers += 1  # taken back when it ends
            if self._queue and self._workers == self._busy:
                self._start_worker()

    def _start_worker(self) -> None:
        if self._workers >= self._max_workers:
            return
        self._workers += 1
        self.started += 1
        name = f"{self._thread_name_prefix}-{self._workers}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue and not self._closed:
                    self._idle += 1
                    deadline = time.monotonic() + IDLE_SECONDS  # linger: calls come in bursts
                    while not self._queue and not self._closed and (left := deadline - time.monotonic()) > 0:
                        self._lock.wait(timeout=left)
                    self._idle -= 1
                if not self._queue:
                    self._workers -= 1
                    return
                future, call, fn = self._queue.popleft()
                if not future.set_running_or_notify_cancel():
                    continue
                self._running[future] = fn
                self._busy += 1
                if self._queue and self._workers == self._busy:
                    self._start_worker()  # this call may block: the ones queued behind it get a thread
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting coroutine, like the stock executor
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._running.pop(future, None)
                    if future in self._given_up:
                        self._given_up.discard(future)
                        self._max_workers -= 1
                    if self._draining:
                        self._drained.notify_all()

    def in_flight(self) -> list[str]:
        """What is running now, by function name."""
        with self._lock:
            return [_describe(fn) for fn in self._running.values()]

    def drain(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` for the calls queued and running now; the ones still there, by name.

        The pool stays open: a pool shared by the process outlives each run's loop.
        """
        with self._lock:
            self._draining += 1
            try:
                deadline = time.monotonic() + timeout
                while self._running or self._queue:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._drained.wait(timeout=remaining)
                return [_describe(fn) for fn in (*self._running.values(), *(fn for _, _, fn in self._queue))]
            finally:
                self._draining -= 1

    def shutdown(
        self,
        wait: bool = True,
        *,
        cancel_futures: bool = False,
        timeout: float | None = None,
        notice: Callable[[list[str], float], object] | None = None,
    ) -> None:
        """Take no new calls; with ``wait``, wait up to ``timeout`` (default: the grace) for running ones.

        ``notice(calls, seconds)`` is called if calls still run :data:`NOTICE_AFTER`
        seconds into a longer wait, with how much of it is left: a user then sees
        why the session does not end, instead of a silent pause.
        """
        with self._lock:
            self._closed = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            self._lock.notify_all()
            if not wait:
                return
        timeout = self.grace if timeout is None else timeout
        first = min(timeout, NOTICE_AFTER) if notice is not None else timeout
        left = self.drain(first)
        if left and notice is not None and timeout > first:
            notice(left, timeout - first)
            left = self.drain(timeout - first)
        self.abandoned = left


class LoopCall:
    """A :meth:`BlockingCallPool.call_for` call: the part of a future its worker uses, and the loop's
    future (:attr:`waiter`) that its outcome settles."""

    __slots__ = ("_cancelled", "_done", "_error", "_fn", "_result", "_settler", "waiter")

    def __init__(self, waiter: asyncio.Future[Any], settler: _Settler, fn: Callable[..., Any]) -> None:
        self.waiter = waiter
        self._settler = settler
        self._fn = fn  # for the message of a StopIteration only (named then, not per call)
        self._done = False
        self._cancelled = False
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """Whether the call ended (in its worker, or cancelled while queued)."""
        return self._done

    def set_running_or_notify_cancel(self) -> bool:
        return not self._done  # cancelled while queued: the worker skips it

    def set_result(self, result: Any) -> None:
        self._result, self._done = result, True
        self._settler.push(self)

    def set_exception(self, error: BaseException) -> None:
        self._error, self._done = error, True
        self._settler.push(self)

    def cancel(self) -> bool:
        """Queued at a shutdown that cancels: the awaiting coroutine is cancelled."""
        self._cancelled, self._done = True, True
        self._settler.push(self)
        return True

    def _settle(self) -> None:
        waiter = self.waiter
        if waiter.done():  # its awaiting task was cancelled: the call ran on, abandoned
            return
        if self._cancelled:  # not a CancelledError the function raised: that is its outcome, as any error
            waiter.cancel()
        elif isinstance(self._error, StopIteration):  # a future refuses it (it would end a coroutine)
            said = f": {self._error}" if str(self._error) else ""
            refused = RuntimeError(f"{_describe(self._fn)} raised StopIteration{said}")
            refused.__cause__ = self._error
            waiter.set_exception(refused)
        elif self._error is not None:
            waiter.set_exception(self._error)
        else:
            waiter.set_result(self._result)


class _Settler:
    """Hands the outcomes of finished :class:`LoopCall` calls to one loop: one wake-up for all the
    calls that finished since the last (each wake-up is a write to the loop's self-pipe)."""

    __slots__ = ("_loop", "_pending", "_ready")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the pool keeps its settlers, and a loop kept alive by one would never leave the pool
        # registry (``_LOOP_POOLS``, keyed weakly by the loop), nor would the pool.
        self._loop = weakref.ref(loop)
        self._ready: deque[LoopCall] = deque()
        self._pending = False

    def push(self, call: LoopCall) -> None:
        """In a worker: ``call`` ended. Appended first, then the flag read: a settle that has begun
        when the flag is seen set takes this call too (the settle clears the flag before it pops)."""
        self._ready.append(call)
        if not self._pending:
            self._pending = True
            loop = self._loop()
            try:
                if loop is not None:
                    loop.call_soon_threadsafe(self._settle)
            except RuntimeError:
                pass  # the loop closed meanwhile: no one awaits it any more

    def _settle(self) -> None:
        self._pending = False
        ready = self._ready
        try:
            while ready:
                ready.popleft()._settle()
        finally:
            loop = self._loop()
            if ready and loop is not None:  # one raised (the loop's handler says so): the rest next
                self._pending = True
                loop.call_soon(self._settle)


#: The pool each of the plugin's loops runs blocking calls on (see :func:`use_pool`).
_LOOP_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BlockingCallPool] = weakref.WeakKeyDictionary()


def use_pool(loop: asyncio.AbstractEventLoop, pool: BlockingCallPool) -> None:
    """Make ``pool`` the default executor of ``loop`` (``asyncio.to_thread``) and findable by :func:`pool_of`."""
    loop.set_default_executor(pool)
    _LOOP_POOLS[loop] = pool


def pool_of(loop: asyncio.AbstractEventLoop) -> BlockingCallPool | None:
    """The pool :func:`use_pool` gave ``loop``, if any."""
    return _LOOP_POOLS.get(loop)


#: Pools shared by the process (the removal of ``local`` workspaces): their
#: calls outlive a task's cancellation, so a run's loop waits for them at its
#: end like for its own pool's (:func:`drain_shared_pools`).
_SHARED: weakref.WeakSet[BlockingCallPool] = weakref.WeakSet()


def shared_pool(max_workers: int, name: str) -> BlockingCallPool:
    """A pool for the whole process whose calls every run waits for when its loop ends."""
    pool = BlockingCallPool(max_workers, grace=0.0, name=name)
    _SHARED.add(pool)
    return pool


def drain_shared_pools(timeout: float) -> list[str]:
    """Wait up to ``timeout`` in all for the shared pools' calls; those still running, by name."""
    deadline = time.monotonic() + timeout
    left: list[str] = []
    for pool in list(_SHARED):
        left += pool.drain(max(0.0, deadline - time.monotonic()))
    return left


def run_with_pool(coro: Coroutine[Any, Any, T], *, max_workers: int, grace: float) -> T:
    """``asyncio.run(coro)`` with a :class:`BlockingCallPool` as the default executor."""
    with asyncio.Runner() as runner:
        use_pool(runner.get_loop(), BlockingCallPool(max_workers, grace))
        return runner.run(coro)
