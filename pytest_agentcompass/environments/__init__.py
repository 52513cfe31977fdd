"""Environment providers: the contract and the embedded ``local`` provider.

Names load on first use: the runtime imports :mod:`.base` alone, and a run
on another provider does not pay for ``local``'s modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import BaseEnvironment, EnvironmentSession, SessionConfig, SessionPurpose
    from .local import LocalEnvironment, LocalSession

__all__ = [
    "BaseEnvironment",
    "EnvironmentSession",
    "LocalEnvironment",
    "LocalSession",
    "SessionConfig",
    "SessionPurpose",
]

_HOMES = {
    "BaseEnvironment": ".base",
    "EnvironmentSession": ".base",
    "SessionConfig": ".base",
    "SessionPurpose": ".base",
    "LocalEnvironment": ".local",
    "LocalSession": ".local",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)
