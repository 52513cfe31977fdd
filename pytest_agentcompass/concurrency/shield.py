"""Cleanup that must finish even when the task running it is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

__all__ = ["uncancellable"]


async def uncancellable(awaitable: Awaitable[None]) -> None:
    """Finish ``awaitable`` even if we are cancelled meanwhile, then re-raise the cancel.

    A second cancel while it finishes is passed on to it.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
