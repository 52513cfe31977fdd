"""Provider limits: capacity permits and open-rate throttles.

Both are keyed by Environment id and shared by every event loop and every
orchestration in the process, so the state is guarded by ``threading`` locks
and waiters are woken with ``call_soon_threadsafe`` on their own loop.

When several processes run one session (pytest-xdist workers), the limits
are run-wide instead: :func:`use_permit_service` connects this process to
the controller's :class:`~.permits.PermitService`, and the same
functions then hand out :class:`RemotePermits` and :class:`RemoteRateLimiter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .permits import PermitClient

__all__ = [
    "CapacityPermits",
    "OpenRateLimiter",
    "RemotePermits",
    "RemoteRateLimiter",
    "capacity_for",
    "on_run_stop",
    "rate_limiter_for",
    "reset_limits",
    "task_slots",
    "use_permit_service",
]


class CapacityPermits:
    """A counting semaphore usable from several event loops; ``0`` is unlimited."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._in_use = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        #: Highest number of permits ever held at once (for tests and progress).
        self.peak = 0

    @property
    def in_use(self) -> int:
        return self._in_use

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.limit == 0 or (self._in_use < self.limit and not self._waiters):
                self._take()
                return
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))
                    raise
            # The permit was handed to us as we were cancelled: pass it on.
            if future.done() and not future.cancelled():
                self.release()
            raise

    def release(self) -> None:
        with self._lock:
            self._in_use -= 1
            self._wake()

    def _take(self) -> None:
        self._in_use += 1
        self.peak = max(self.peak, self._in_use)

    def _wake(self) -> None:
        # Called with the lock held: hand free permits to waiters in FIFO order.
        while self._waiters and (self.limit == 0 or self._in_use < self.limit):
            loop, future = self._waiters.popleft()
            if future.done():
                continue
            self._take()
            try:
                loop.call_soon_threadsafe(self._grant, future)
            except RuntimeError:  # that loop is closed: its waiter is gone
                self._in_use -= 1

    def _grant(self, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            self.release()
        else:
            future.set_result(None)

    @asynccontextmanager
    async def permit(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


class OpenRateLimiter:
    """Spaces ``open`` calls at least ``1 / qps`` seconds apart; ``0`` is unlimited."""

    def __init__(self, qps: float) -> None:
        self.qps = qps
        self._lock = threading.Lock()
        self._next_slot = 0.0

    async def wait(self) -> None:
        if self.qps <= 0:
            return
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next_slot)
            self._next_slot = slot + 1.0 / self.qps
        if slot > now:
            await asyncio.sleep(slot - now)


class RemotePermits(CapacityPermits):
    """Permits counted run-wide by the permit service; ``0`` is unlimited (no round trip)."""

    def __init__(self, client: PermitClient, key: str, limit: int) -> None:
        super().__init__(limit)
        self._client = client
        self._key = key
        self._remote = 0  # permits of this process that came from the service

    async def acquire(self) -> None:
        if self.limit == 0:
            with self._lock:
                self._take()
            return
        await self._client.acquire(self._key, self.limit)
        with self._lock:
            self._take()
            self._remote += 1

    def release(self) -> None:
        with self._lock:
            self._in_use -= 1
            remote = self._remote > 0
            if remote:
                self._remote -= 1
        if remote:
            # The service gone (a Ctrl-C'd run ending), what this process held went with it.
            with contextlib.suppress(ConnectionError):
                self._client.release(self._key)


class RemoteRateLimiter(OpenRateLimiter):
    """Open slots spaced run-wide by the permit service."""

    def __init__(self, client: PermitClient, key: str, qps: float) -> None:
        super().__init__(qps)
        self._client = client
        self._key = key

    async def wait(self) -> None:
        if self.qps <= 0:
            return
        delay = await self._client.slot_delay(self._key, self.qps)
        if delay > 0:
            await asyncio.sleep(delay)


_registry_lock = threading.Lock()
_capacities: dict[str, CapacityPermits] = {}
_rates: dict[str, OpenRateLimiter] = {}
_service: PermitClient | None = None


def use_permit_service(address: str) -> None:
    """Count every limit of this process run-wide, through the service at ``address``."""
    from .permits import PermitClient

    global _service
    reset_limits()
    _service = PermitClient(address)


def on_run_stop(callback: Callable[[str, bool], None]) -> None:
    """Call ``callback(reason, interrupt)`` (from another thread) when the run stops starting tasks.

    ``-x`` elsewhere is a stop; a Ctrl-C the controller alone received is an interrupt.
    """
    with _registry_lock:
        if _service is not None:
            _service.on_stop = callback
            if _service.stopped is not None:
                callback(_service.stopped, _service.interrupted)


def task_slots(limit: int) -> CapacityPermits | None:
    """Run-wide permits for ``task_concurrency`` when a permit service is in use; else ``None``."""
    with _registry_lock:
        if _service is None or limit <= 0:
            return None
        return RemotePermits(_service, "tasks", limit)


def capacity_for(environment_id: str, limit: int) -> CapacityPermits:
    """The shared permits of ``environment_id``.

    When several requests configure one provider differently, the smallest
    non-zero capacity wins: a limit is a promise to the provider's host.
    """
    with _registry_lock:
        permits = _capacities.get(environment_id)
        if permits is None:
            if _service is not None:
                permits = RemotePermits(_service, f"capacity:{environment_id}", limit)
            else:
                permits = CapacityPermits(limit)
            _capacities[environment_id] = permits
        elif limit and (permits.limit == 0 or limit < permits.limit):
            permits.limit = limit
        return permits


def rate_limiter_for(environment_id: str, qps: float) -> OpenRateLimiter:
    """The shared open-rate limiter of ``environment_id`` (smallest non-zero rate wins)."""
    with _registry_lock:
        limiter = _rates.get(environment_id)
        if limiter is None:
            if _service is not None:
                limiter = RemoteRateLimiter(_service, f"open:{environment_id}", qps)
            else:
                limiter = OpenRateLimiter(qps)
            _rates[environment_id] = limiter
        elif qps and (limiter.qps == 0 or qps < limiter.qps):
            limiter.qps = qps
        return limiter


def reset_limits() -> None:
    """Forget every limit and leave the permit service (between runs in one process, e.g. pytester)."""
    global _service
    with _registry_lock:
        _capacities.clear()
        _rates.clear()
        if _service is not None:
            _service.close()
            _service = None
