"""After a real kill -9, later runs remove what the killed run left: processes, workspaces, containers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import kill_with_its_reapers

from conftest import write_config

BENCH = """
import dataclasses, os
from pathlib import Path
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

PIDS = Path(os.environ["AGENT_PIDS"])


class Daemons(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(2)]

    async def run_task(self, task, prepared, env, req, plan):
        if not os.environ.get("AGENT_QUICK"):
            # An agent that leaves a daemon: its own session, no pipes; then works on.
            daemon = f"setsid sh -c 'echo $$ >> {PIDS}; exec sleep 300' </dev/null >/dev/null 2>&1 &"
            await env.exec(["sh", "-c", daemon + " sleep 300"])
        return RunResult(task.task_id, output="ok")

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def finish(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def pytest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *args]


@pytest.fixture
def setup(pytester: pytest.Pytester) -> tuple[pytest.Pytester, dict[str, str]]:
    pytester.makepyfile(bench=BENCH)
    (pytester.path / "ws").mkdir()
    request = {
        "name": "r",
        "benchmark": {"id": "bench.py:Daemons"},
        "environment": {"id": "local", "params": {"base_dir": str(pytester.path / "ws")}},
    }
    write_config(pytester, [request], task_concurrency=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "AGENT_PIDS": str(pytester.path / "pids")}
    return pytester, env


def kill_a_run(pytester: pytest.Pytester, env: dict[str, str]) -> tuple[list[int], str]:
    """Start a run, wait until both agents left their daemon, then SIGKILL pytest and its exec reapers."""
    proc = subprocess.Popen(pytest_cmd(), cwd=pytester.path, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    pids = pytester.path / "pids"
    while not (pids.exists() and len(pids.read_text().split()) >= 2):
        assert proc.poll() is None, "the run ended before its agents started"
        time.sleep(0.05)
    kill_with_its_reapers(proc.pid)  # nothing is left to kill the daemons at once
    proc.wait()
    daemons = [int(p) for p in pids.read_text().split()]
    assert all(alive(pid) for pid in daemons)  # nothing was left to kill them
    pids.unlink()
    (run_dir,) = (pytester.path / "runs" / "r").iterdir()
    return daemons, run_dir.name


def rerun(pytester: pytest.Pytester, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        pytest_cmd(*args), cwd=pytester.path, env={**env, "AGENT_QUICK": "1"}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_resumed_run_kills_the_agent_processes_of_the_killed_run(
    setup: tuple[pytest.Pytester, dict[str, str]],
) -> None:
    pytester, env = setup
    daemons, _ = kill_a_run(pytester, env)
    try:
        rerun(pytester, env)
        assert not any(alive(pid) for pid in daemons)
        assert not list((pytester.path / "ws").iterdir())
    finally:
        finish(daemons)


def test_a_run_completed_in_between_does_not_hide_the_killed_one(
    setup: tuple[pytest.Pytester, dict[str, str]],
) -> None:
    pytester, env = setup
    daemons, killed_run = kill_a_run(pytester, env)
    try:
        # A new run (not resuming the killed one) completes: it sweeps the killed one all the same.
        rerun(pytester, env, "--agentcompass-new-run")
        assert not any(alive(pid) for pid in daemons)
        assert not list((pytester.path / "ws").iterdir())
        (new_run,) = [p for p in (pytester.path / "runs" / "r").iterdir() if p.name != killed_run]
        notes = json.loads((new_run / "run_info.json").read_text())["notes"]
        assert any(f"left behind by run {killed_run}" in note for note in notes)
        # Recorded as swept: still resumable (not completed), never swept again.
        killed = json.loads((pytester.path / "runs" / "r" / killed_run / "run_info.json").read_text())
        assert killed["status"] == "interrupted" and new_run.name in killed["stop_reason"]
        rerun(pytester, env, "--agentcompass-new-run")
        newest = max((p for p in (pytester.path / "runs" / "r").iterdir()), key=lambda p: p.name)
        notes = json.loads((newest / "run_info.json").read_text())["notes"]
        assert not any("left behind" in note for note in notes)
    finally:
        finish(daemons)
