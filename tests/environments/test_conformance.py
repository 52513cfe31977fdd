"""The provider conformance kit, run against the providers this project ships."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pytest_agentcompass import BaseEnvironment, EnvironmentSpec, LocalEnvironment
from pytest_agentcompass.environments.conformance import EnvironmentConformance

from tracing import TracingEnvironment


class TestLocalEnvironment(EnvironmentConformance):
    def make_provider(self, tmp_path: Path) -> BaseEnvironment:
        (tmp_path / "ws").mkdir(exist_ok=True)
        return LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path / "ws")}))

    def leaked(self, provider: BaseEnvironment, tmp_path: Path) -> list[Any]:
        return sorted((tmp_path / "ws").iterdir())


class TestDynamicPolicyEnvironment(EnvironmentConformance):
    """A provider that can switch policies live takes the other branch of the rules."""

    def make_provider(self, tmp_path: Path) -> BaseEnvironment:
        (tmp_path / "ws").mkdir(exist_ok=True)
        params = {"base_dir": str(tmp_path / "ws"), "trace": str(tmp_path / "trace.jsonl")}
        return TracingEnvironment(EnvironmentSpec(id="tracing", params=params))

    def leaked(self, provider: BaseEnvironment, tmp_path: Path) -> list[Any]:
        return sorted((tmp_path / "ws").iterdir())


def test_the_kits_process_probe_reads_only_a_pid(tmp_path: Path) -> None:
    """An empty pid file (its shell killed between creating and writing it) is no process.

    The probe used to read ``/proc//stat`` then: the kernel's statistics, whose
    first line looked like a running process, so a cancel that landed right
    after the start failed the kit's check one time in a few hundred.
    """
    kit = TestLocalEnvironment()
    provider = kit.make_provider(tmp_path)

    async def scenario() -> None:
        session = await kit._open(provider)
        try:
            await session.write_text("empty.pid", "")
            assert not await kit._running(session, "empty.pid")
            await session.write_text("me.pid", f"{os.getpid()}\n")
            assert await kit._running(session, "me.pid"), "a live process is still found"
            await session.write_text("gone.pid", "4194304999")
            assert not await kit._running(session, "gone.pid")
        finally:
            await session.close()

    asyncio.run(scenario())
