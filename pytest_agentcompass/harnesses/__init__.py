"""Harnesses: the contract and the built-in ``command`` harness.

Names load on first use: the runtime imports :mod:`.base` alone, and a run
that never uses ``command`` does not pay for its pydantic model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import BaseHarness
    from .command import CommandHarness

__all__ = ["BaseHarness", "CommandHarness"]

_HOMES = {"BaseHarness": ".base", "CommandHarness": ".command"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)
