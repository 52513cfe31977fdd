"""The model gateway: agents in a sandbox reach their model through the runner, never with the real key.

A harness asks for it with ``needs_gateway = True``; the runtime then gives it
``self.gateway`` (a :class:`ModelGateway`, one per request, started on first
use and closed when the request ends). In ``run``, each attempt opens a grant::

    async with self.gateway.open_attempt(env, task.task_id, plan.attempt_index) as grant:
        outcome = await env.exec(argv, env=grant.env(), timeout=...)
    return grant.finish(RunResult(task.task_id, output=outcome.stdout))

``grant.base_url(protocol)`` and ``grant.token`` configure the agent (or
``grant.env()`` sets the variables the official clients read); after the
block, ``grant.calls`` and ``grant.usage()`` hold what the agent used, and
``grant.finish(result)`` adds ``metadata.usage`` and the ``trajectory``
artifact to the result. See docs/api.md ("The model gateway").

Names load on first use; ``aiohttp`` is imported only when a gateway starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models.ledger import PROTOCOLS, ModelCall, Protocol
    from .grant import Grant
    from .server import ModelGateway
    from .settings import GatewaySettings

_EXPORTS = {
    "GatewaySettings": ".settings",
    "Grant": ".grant",
    "ModelCall": "..models.ledger",
    "ModelGateway": ".server",
    "PROTOCOLS": "..models.ledger",
    "Protocol": "..models.ledger",
}

__all__ = ["PROTOCOLS", "GatewaySettings", "Grant", "ModelCall", "ModelGateway", "Protocol"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
