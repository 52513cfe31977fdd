"""Providers sit below the runtime: importing one loads no runtime module."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("provider", ["local", "docker"])
def test_importing_a_provider_loads_no_runtime_module(provider: str) -> None:
    module = f"pytest_agentcompass.environments.{provider}"
    # A fresh interpreter: this one has imported the runtime already.
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    loaded = [name for name in json.loads(out) if name.startswith("pytest_agentcompass.")]
    assert module in loaded
    assert [name for name in loaded if name.startswith("pytest_agentcompass.runtime")] == []
