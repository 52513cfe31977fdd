"""A session on one engine of a Docker pool (:class:`~.docker_pool.EnginePool`): the provider's
session inside, with every call's engine fault turned into the error an attempt should see, and the
engine's slot given back once the session closes (or is kept)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from ..vocabulary.errors import SessionError
from ..vocabulary.types import ExecResult, NetworkPolicy
from .base import EnvironmentSession
from .docker_engine import Engine

__all__ = ["EngineSlots", "PooledSession"]


class EngineSlots(Protocol):
    """What a pooled session needs of its pool (:class:`~.docker_pool.EnginePool`)."""

    async def fault(self, engine: Engine, exc: Exception) -> Exception:
        """``exc`` as the attempt should see it (an environment error when the engine stopped answering)."""
        ...

    def release(self, engine: Engine) -> None:
        """Give back the slot a session on ``engine`` held."""
        ...


class PooledSession(EnvironmentSession):
    """A provider session on one engine of the pool: engine faults become environment errors,
    and closing gives the engine's slot back."""

    def __init__(self, pool: EngineSlots, engine: Engine, inner: EnvironmentSession) -> None:
        self.pool = pool
        self.engine = engine
        self.inner = inner
        #: The engine, recorded in the attempt's result.
        self.placement = engine.name
        self._released = False

    def __getattr__(self, name: str) -> Any:  # the provider's own attributes (container, client, ...)
        return getattr(self.inner, name)

    @property
    def network_policy(self) -> NetworkPolicy:
        return self.inner.network_policy

    @network_policy.setter
    def network_policy(self, policy: NetworkPolicy) -> None:
        self.inner.network_policy = policy

    async def _call(self, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await call()
        except Exception as exc:
            raised = await self.pool.fault(self.engine, exc)
            if raised is exc:
                raise
            raise raised from exc

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> ExecResult:
        result: ExecResult = await self._call(
            lambda: self.inner.exec(argv, timeout=timeout, env=env, cwd=cwd, **options)
        )
        return result

    async def read_bytes(self, path: str) -> bytes:
        data: bytes = await self._call(lambda: self.inner.read_bytes(path))
        return data

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._call(lambda: self.inner.write_bytes(path, data))

    async def put_tree(self, source: str | os.PathLike[str], target: str) -> None:
        await self._call(lambda: self.inner.put_tree(source, target))  # type: ignore[attr-defined]

    async def get_tree(self, source: str, limit: int) -> tuple[dict[str, bytes], bool]:
        found: tuple[dict[str, bytes], bool] = await self._call(
            lambda: self.inner.get_tree(source, limit)  # type: ignore[attr-defined]
        )
        return found

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        await self._call(lambda: self.inner.set_network_policy(policy))

    async def close(self) -> None:
        try:
            await self._call(self.inner.close)
        except SessionError:
            if self.engine.down is None:
                raise
            # The engine is gone (a note says so): its container is removed once it answers again.
            container = getattr(self.inner, "container", None)
            if container is not None and container.id not in self.engine.orphans:
                self.engine.orphans.append(container.id)
        finally:
            await self.detach()

    async def detach(self) -> None:
        """Give the engine's slot back (at close, or when the attempt keeps the container)."""
        if not self._released:
            self._released = True
            self.pool.release(self.engine)

    def describe(self) -> str:
        return f"{self.inner.describe()} on {self.engine.name}"
