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
    attempt = run_dir / "artifacts" / "offline-archive" / "attempt-0"
    # allow_internet = false: the agent ran with no network interface but lo.
    assert (attempt / "logs" / "agent" / "interfaces.txt").read_text().split() == ["lo"]
    assert (attempt / "verifier" / "logs" / "reward.txt").read_text().strip() == "1"
    assert (attempt / "verifier" / "test-stdout.txt").exists()
    # The solution's transcript, kept by the runner beside the copy of the container's /logs/agent.
    transcript = run_dir / "artifacts" / "offline-archive" / "attempt-0" / "agent" / "oracle.txt"
    assert transcript.exists()
    # hello-file asks for a verifier of its own: built from its tests/, run apart from the agent.
    plans = json.loads((run_dir / "run_info.json").read_text())["resolved_execution_plans"]
    assert plans["hello-file"]["0"]["environment"]["verifier_mode"] == "separate"
    assert plans["count-lines"]["0"]["environment"]["verifier_mode"] == "shared"
    assert containers_of(run_dir.name) == []


def test_oracle_passes_in_every_verifier_mode(pytester: pytest.Pytester) -> None:
    shutil.copytree(ROOT / "example_suites", pytester.path / "example_suites")
    result = pytester.runpytest_subprocess("--agentcompass=example_suites/terminal/modes.yaml", "-n", "2")
    result.assert_outcomes(passed=15)
    for mode in ("shared", "snapshot", "separate"):
        result.stdout.fnmatch_lines([f"terminal-{mode}: 5 tasks, 5 passed, 0 failed, 0 errors"])
        run_dir, _ = run_of(pytester.path, f"terminal-{mode}")
        assert containers_of(run_dir.name) == []
        images = subprocess.run(
            ["docker", "images", "-q", "--filter", f"label=agentcompass.run={run_dir.name}"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert images.stdout.split() == []  # no snapshot outlives its attempt


def test_fresh_evaluation_verifies_the_agents_work(pytester: pytest.Pytester) -> None:
    # The spec's fresh mode on Harbor tasks: a new container, from a snapshot of the agent's.
    shutil.copytree(ROOT / "example_suites" / "terminal" / "tasks", pytester.path / "tasks")
    config = {
        "output_dir": "runs",
        "requests": [
            {
                "name": "fresh",
                "benchmark": {"id": "harbor", "params": {"path": "tasks"}},
                "harness": {"id": "oracle"},
                "environment": {"id": "docker", "evaluation_environment_mode": "fresh"},
            }
        ],
    }
    (pytester.path / "agentcompass.yaml").write_text(json.dumps(config))
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)
    (run_dir,) = (pytester.path / "runs" / "fresh").iterdir()
    plans = json.loads((run_dir / "run_info.json").read_text())["resolved_execution_plans"]
    assert {p["0"]["environment"]["verifier_mode"] for p in plans.values()} == {"snapshot", "separate"}
    assert {p["0"]["evaluation_environment_mode"] for p in plans.values()} == {"fresh"}


def test_nop_fails_every_task(pytester: pytest.Pytester, checkout: Path) -> None:
    result = pytester.runpytest_subprocess(f"--agentcompass={checkout}/example_suites/terminal/nop.yaml")
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines(["terminal-nop: 5 tasks, 0 passed, 5 failed, 0 errors"])
    run_dir, details = run_of(checkout, "terminal-nop")
    assert {d["score"] for d in details.values()} == {0.0}
    assert details["fix-config"]["metadata"]["rewards"]["kept_lines"] == 1.0  # a part nop cannot break
    assert containers_of(run_dir.name) == []
