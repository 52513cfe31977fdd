"""``-n`` through pytest-xdist: workers run tasks, the controller finalizes from the run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import tracing_request, write_config


def test_tasks_run_on_workers_and_the_controller_summarizes(pytester: pytest.Pytester, trace: Path) -> None:
    write_config(
        pytester,
        [tracing_request("a", trace, n=4, wrong=["t1"]), tracing_request("b", trace, n=2, fail={"run": {"t0": -1}})],
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-n", "2", "--junitxml=j.xml")
    result.assert_outcomes(passed=4, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*a: 4 tasks, 3 passed, 1 failed, 0 errors*", "*b: 2 tasks, 1 passed, 0 failed, 1 errors*"]
    )
    pids = {json.loads(line)["pid"] for line in trace.read_text().splitlines() if '"run_task"' in line}
    assert len(pids) == 2, "both workers ran tasks"
    (run_a,) = (pytester.path / "runs/a").iterdir()
    (run_b,) = (pytester.path / "runs/b").iterdir()
    assert run_a.name == run_b.name, "one run id for every worker"
    summary = json.loads((run_a / "summary.json").read_text())
    assert [t["task_id"] for t in summary["tasks"]] == ["t0", "t1", "t2", "t3"]
    assert summary["metrics"]["passed"] == 3
    assert json.loads((run_a / "run_info.json").read_text())["status"] == "completed"
    props = [p.get("name") for p in ET.parse(pytester.path / "j.xml").getroot().iter("property")]
    assert props.count("agentcompass.status") == 6


def test_plain_tests_and_tasks_together_under_xdist(pytester: pytest.Pytester, trace: Path) -> None:
    pytester.makepyfile(test_unit="def test_unit():\n    pass\n")
    write_config(pytester, [tracing_request("a", trace, n=2)])
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "test_unit.py", "-n", "2")
    result.assert_outcomes(passed=3)


HANGING = """
import asyncio, dataclasses, os
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Hanging(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(8)]
    async def run_task(self, task, prepared, env, req, plan):
        if int(task.task_id[1:]) >= 2 and os.path.exists(os.path.join(os.path.dirname(__file__), "hang")):
            open(os.path.join(os.path.dirname(__file__), "hanging-" + task.task_id), "w").close()
            await asyncio.sleep(120)
        return RunResult(task.task_id, output="ok")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


def test_an_interrupted_distributed_run_is_interrupted_and_resumable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(hanging=HANGING)
    (pytester.path / "hang").touch()
    write_config(pytester, [{"name": "r", "benchmark": {"id": "hanging.py:Hanging"}}])
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:randomly", "-n", "2"],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,  # Ctrl-C in a terminal reaches the whole process group
    )
    deadline = time.monotonic() + 60
    while len(list(pytester.path.glob("hanging-*"))) < 2:  # both workers are stuck in a task
        assert time.monotonic() < deadline and proc.poll() is None, "tasks never hung"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    done = len(list((run_dir / "details").glob("*.json")))
    assert 2 <= done < 8
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "interrupted", out
    assert len(info["unfinished_tasks"]) == 8 - done
    assert (
        not (run_dir / "summary.json").exists()
        or json.loads((run_dir / "summary.json").read_text())["status"] != "completed"
    )

    (pytester.path / "hang").unlink()
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines([f"agentcompass: r: resuming {run_dir} ({done} of 8 tasks done)"])
    assert [p.name for p in (pytester.path / "runs/r").iterdir()] == [run_dir.name]
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "completed"
