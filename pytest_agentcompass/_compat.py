"""Small helpers for calling user code that may be sync or async."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["maybe_await"]


async def maybe_await(value: Any) -> Any:
    """Await ``value`` if a lifecycle method returned an awaitable.

    Benchmark and harness methods may be plain functions or coroutines.
    """
    if inspect.isawaitable(value):
        return await value
    return value
