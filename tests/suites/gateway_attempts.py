"""One attempt's grant on a real model gateway on loopback, for tests that play the agent themselves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from pytest_agentcompass import EnvironmentSpec
from pytest_agentcompass.environments.local import LocalEnvironment
from pytest_agentcompass.gateway import GatewaySettings, Grant, ModelGateway

__all__ = ["gateway_attempt", "until"]


@asynccontextmanager
async def gateway_attempt(model: str, settings: GatewaySettings, **gateway: Any) -> AsyncIterator[Grant]:
    """A gateway for ``model`` (a ``local`` provider, so no container), and attempt 0 of ``task-1`` open on it."""
    served = ModelGateway(model, settings, LocalEnvironment(EnvironmentSpec(id="local")), harness="t", **gateway)
    served.preflight()
    try:
        async with served.open_attempt(None, "task-1", 0) as grant:  # type: ignore[arg-type]
            yield grant
    finally:
        await served.aclose()


async def until(condition: Callable[[], bool]) -> None:
    """Wait on the loop (the gateway keeps serving) until ``condition()`` holds; 60 s backstop."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")
