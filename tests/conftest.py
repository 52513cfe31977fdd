"""Shared helpers: write agentcompass configs into a pytester directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

SUITES = Path(__file__).parent / "suites"
# Suite files are material for the tests (task dirs carry their own test_*.py), not tests.
collect_ignore = ["suites"]
TRACING = f"{SUITES / 'tracing.py'}"
sys.path.insert(0, str(SUITES))


def tracing_request(
    name: str,
    trace: Path,
    *,
    n: int = 3,
    mode: str = "none",
    harness: bool = False,
    env_params: dict[str, Any] | None = None,
    **bench: Any,
) -> dict[str, Any]:
    """A request of the tracing suite (see ``tests/suites/tracing.py``)."""
    execution = bench.pop("execution", {})
    environment = bench.pop("environment", {})
    request: dict[str, Any] = {
        "name": name,
        "benchmark": {
            "id": f"{TRACING}:{'TracingHarnessBenchmark' if harness else 'TracingBenchmark'}",
            "params": {"trace": str(trace), "n": n, "mode": mode, **bench},
        },
        "harness": {"id": f"{TRACING}:TracingHarness", "params": {"trace": str(trace), **bench}}
        if harness
        else {"id": "none"},
        "environment": {
            "id": f"{TRACING}:TracingEnvironment",
            "params": {"trace": str(trace), **(env_params or {})},
            **environment,
        },
        "execution": {"retry_backoff_seconds": 0, **execution},
    }
    return request


def write_config(
    pytester: pytest.Pytester, requests: list[dict[str, Any]], name: str = "agentcompass.yaml", **top: Any
) -> Path:
    data = {"output_dir": "runs", **top, "requests": requests}
    path = pytester.path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def trace(pytester: pytest.Pytester) -> Path:
    return pytester.path / "trace.jsonl"


def start_pytest(pytester: pytest.Pytester, *args: str) -> subprocess.Popen[str]:
    """A real ``pytest`` process on the config in ``pytester.path`` (for signals and kills)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *args],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
