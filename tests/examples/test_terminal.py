"""The terminal example suite: the README's two commands and the outcomes it documents."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from harbor_tasks import BUSYBOX, containers_of

ROOT = Path(__file__).parents[2]

if subprocess.run(["docker", "image", "inspect", BUSYBOX], capture_output=True, check=False).returncode != 0:
    if os.environ.get("CI"):
        raise RuntimeError("CI must start the Docker engine first: bash scripts/start-docker.sh")
    pytest.skip("no Docker engine with the test image (run scripts/start-docker.sh)", allow_module_level=True)


def run_of(base: Path, request: str) -> tuple[Path, dict[str, dict[str, Any]]]:
    (run_dir,) = (base / "example_suites/terminal/.agentcompass/runs" / request).iterdir()
    return run_dir, {p.stem: json.loads(p.read_text()) for p in (run_dir / "details").glob("*.json")}


@pytest.fixture
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples in a folder other than the one pytest starts in: the configs work from anywhere."""
    folder = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "example_suites", folder / "example_suites")
    return folder


def test_oracle_passes_every_task(pytester: pytest.Pytester, checkout: Path) -> None:
    result = pytester.runpytest_subprocess(f"--agentcompass={checkout}/example_suites/terminal/oracle.yaml")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["terminal-oracle: 5 tasks, 5 passed, 0 failed, 0 errors"])
    run_dir, details = run_of(checkout, "terminal-oracle")
    # reward.json: every number recorded, "reward" is the score; without it, the mean.
    assert details["fix-config"]["metadata"]["rewards"] == {
        "reward": 1.0,
        "port": 1.0,
        "logging": 1.0,
        "kept_lines": 1.0,
    }
    assert details["sort-words"]["metadata"]["rewards"] == {"sorted": 1.0, "unique": 1.0}
    attempt = run_dir / "details" / "offline-archive" / "attempt-0"
    # allow_internet = false: the agent ran with no network interface but lo.
    assert (attempt / "agent" / "interfaces.txt").read_text().split() == ["lo"]
    assert (attempt / "verifier" / "reward.txt").read_text().strip() == "1"
    assert (attempt / "verifier" / "test-stdout.txt").exists()
    assert containers_of(run_dir.name) == []


def test_nop_fails_every_task(pytester: pytest.Pytester, checkout: Path) -> None:
    result = pytester.runpytest_subprocess(f"--agentcompass={checkout}/example_suites/terminal/nop.yaml")
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines(["terminal-nop: 5 tasks, 0 passed, 5 failed, 0 errors"])
    run_dir, details = run_of(checkout, "terminal-nop")
    assert {d["score"] for d in details.values()} == {0.0}
    assert details["fix-config"]["metadata"]["rewards"]["kept_lines"] == 1.0  # a part nop cannot break
    assert containers_of(run_dir.name) == []
