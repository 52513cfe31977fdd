"""A SIGTERM is said as what it is: not "interrupted by the user", in process and under -n."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest

from conftest import start_pytest, write_config

BENCH = """
import asyncio, dataclasses, os
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Sleepy(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(4)]
    async def run_task(self, task, prepared, env, req, plan):
        with open(os.path.join(os.getcwd(), "running"), "a") as out:
            out.write("x")
        await asyncio.sleep(600)
        return RunResult(task.task_id, output="late")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""

STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _kill_what_is_left() -> Iterator[None]:
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "n2"])
def test_a_sigterm_is_named_in_the_record_and_the_errors(pytester: pytest.Pytester, xdist: bool) -> None:
    pytester.makepyfile(bench=BENCH)
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:Sleepy"}}], task_concurrency=4)
    proc = start_pytest(pytester, "--junitxml=junit.xml", *(["-n", "2"] if xdist else []), own_group=True)
    STARTED.append(proc)
    marks = pytester.path / "running"
    while not (marks.exists() and len(marks.read_text()) >= 4):  # every task runs, in each process
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` or a cancelled CI job sends it
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "interrupted by the user" not in out, out
    assert "orchestration interrupted: terminated by a SIGTERM" in out, out
    # pytest's banner named the class that carries it ("!!! ...driver.Terminated !!!").
    banner = [line for line in out.splitlines() if line.startswith("!!!")]
    assert banner and all("Terminated" not in line for line in banner), banner
    assert any("SIGTERM arrived" in line for line in banner), banner
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "interrupted" and info["stop_reason"] == "terminated by a SIGTERM", info
    errors = [e.get("message", "") for e in ET.parse(pytester.path / "junit.xml").getroot().iter("error")]
    assert len(errors) == 4 and all("terminated by a SIGTERM" in e for e in errors), errors


def test_the_reason_of_a_ctrl_c_is_unchanged(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(bench=BENCH)
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:Sleepy"}}], task_concurrency=4)
    proc = start_pytest(pytester, own_group=True)
    STARTED.append(proc)
    marks = pytester.path / "running"
    while not (marks.exists() and len(marks.read_text()) >= 4):
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert "orchestration interrupted: interrupted by the user" in out, out
    assert "SIGTERM" not in out
