"""Model endpoints: settings, the OpenAI-compatible client, usage and cost.

Names load on first use: the runtime imports only ``models.usage`` (for the
token totals), and a run that calls no model never pays for pydantic
settings or the client module; the ``openai`` package itself is imported
only when a client is first built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import ChatModel, MalformedResponseError, ModelCallError
    from .reply import ChatReply
    from .settings import ModelSettings, ResolvedModel, resolve_model
    from .trajectory import Trajectory
    from .usage import Usage, sum_usage

_EXPORTS = {
    "ChatModel": ".client",
    "ChatReply": ".reply",
    "MalformedResponseError": ".client",
    "ModelCallError": ".client",
    "ModelSettings": ".settings",
    "ResolvedModel": ".settings",
    "resolve_model": ".settings",
    "Trajectory": ".trajectory",
    "Usage": ".usage",
    "sum_usage": ".usage",
}

__all__ = [
    "ChatModel",
    "ChatReply",
    "MalformedResponseError",
    "ModelCallError",
    "ModelSettings",
    "ResolvedModel",
    "Trajectory",
    "Usage",
    "resolve_model",
    "sum_usage",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
