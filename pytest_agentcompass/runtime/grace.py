"""Bounded waits once a run stops: what the Orchestrator waits for after a deadline or a Ctrl-C.

Every wait here ends at the first of three things: what it waits for is done, the
cleanup grace is over, or ``forced`` is set (a second Ctrl-C, a SIGTERM). What
it gave up on is returned, so the caller records it instead of hanging on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .request import RequestRuntime

__all__ = ["SWEEP_SECONDS", "close_within_grace", "sweep_environments", "wait_within_grace"]

#: How long removing left-over Environments may take after the cleanup was cut short.
SWEEP_SECONDS = 20.0

log = logging.getLogger("pytest_agentcompass")


async def wait_within_grace(
    futures: Sequence[asyncio.Future[Any]], grace_seconds: float, forced: asyncio.Event
) -> set[asyncio.Future[Any]]:
    """Wait for ``futures`` within ``grace_seconds`` (0: no limit) or until ``forced``; the ones still running."""
    pending: set[asyncio.Future[Any]] = set(futures)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_seconds if grace_seconds else None
    cut: asyncio.Future[Any] = asyncio.ensure_future(forced.wait())
    try:
        while pending and not forced.is_set():
            timeout = None if deadline is None else deadline - loop.time()
            if timeout is not None and timeout <= 0:
                break
            done, _ = await asyncio.wait({*pending, cut}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            pending -= done
    finally:
        cut.cancel()
    return pending


async def close_within_grace(requests: Sequence[RequestRuntime], grace_seconds: float, forced: asyncio.Event) -> bool:
    """Close what each request's harness shares (model clients); False if that was abandoned and still runs."""
    closing: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(s.aclose() for s in requests)))
    if not await wait_within_grace([closing], grace_seconds, forced):
        return True
    closing.cancel()
    why = "a second Ctrl-C cut it short" if forced.is_set() else "it took longer than the cleanup grace"
    log.warning("closing the harnesses was abandoned: %s", why)
    await asyncio.wait({closing}, timeout=1.0)  # let the cancellation land
    return closing.done()


async def sweep_environments(requests: Sequence[RequestRuntime]) -> None:
    """Remove the Environments of this run that cleanups left open (they did not finish in time)."""
    for state in requests:
        try:
            async with asyncio.timeout(SWEEP_SECONDS):
                await state.ctx.provider.sweep_own(state.ctx.run_id)  # under xdist, not the other workers'
        except Exception as exc:  # a bounded best effort: the next run sweeps again
            log.warning("request %s: removing this run's environments failed: %s", state.name, exc)
