"""The provider conformance kit, run against the providers this project ships."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_agentcompass import BaseEnvironment, EnvironmentSpec, LocalEnvironment
from pytest_agentcompass.testing import EnvironmentConformance

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
