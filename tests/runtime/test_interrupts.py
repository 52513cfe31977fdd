"""What ends a run early, other than a deadline: a task's own ``sys.exit()`` or ``KeyboardInterrupt``, a Ctrl-C
while a preflight waits, and a Ctrl-C whose cleanup outlasts the grace. Each ends as in a pytest test session:
one report per task, a recorded run, no noise.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import start_pytest, write_config

HEAD = """
import asyncio, dataclasses, sys, time
from pytest_agentcompass import BaseBenchmark, HarnessFreeBenchmark, RunResult, TaskSpec
from pytest_agentcompass.harnesses.base import BaseHarness

class Base(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(4)]
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""

#: Words that must never reach the user after any of these ends.
NOISE = ("Task was destroyed", "Event loop is closed", "Exception ignored", "INTERNALERROR", "different Context")


NEVER_ENDS = (
    "except asyncio.CancelledError:\n            while True:\n                try:\n"
    "                    await asyncio.sleep(30)\n                except asyncio.CancelledError:\n"
    "                    pass"
)


def run_info(pytester: pytest.Pytester) -> dict[str, object]:
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    info: dict[str, object] = json.loads((run_dir / "run_info.json").read_text())
    return info


def setup(pytester: pytest.Pytester, body: str, cls: str = "B", grace: float = 2.0, **request: object) -> None:
    pytester.makepyfile(bench=HEAD + body)
    write_config(
        pytester,
        [{"name": "r", "benchmark": {"id": f"bench.py:{cls}"}, **request}],
        cleanup_grace_seconds=grace,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, _ = proc.communicate(timeout=timeout)
    for noise in NOISE:
        assert noise not in out, out
    return out


def wait_for_file(proc: subprocess.Popen[str], path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def ctrl_c(proc: subprocess.Popen[str]) -> None:
    """As a terminal sends it: to the whole process group (xdist's workers included)."""
    os.killpg(proc.pid, signal.SIGINT)


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_sys_exit_in_a_task_fails_that_task_alone(pytester: pytest.Pytester, kind: str) -> None:
    body = f"""
class B(Base):
    {"async " if kind == "async" else ""}def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "t1":
            sys.exit(3)
        return RunResult(task.task_id, output="ok")
"""
    setup(pytester, body)
    proc = start_pytest(pytester, *(["-n", "2"] if kind == "sync" else []), own_group=True)
    out = finish(proc)
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "B.run_task called sys.exit(3): the task fails, the run goes on" in out, out
    assert re.search(r'bench\.py", line \d+, in run_task\n +sys\.exit\(3\)', out), "the trace shows the call"
    assert "3 passed, 1 error" in out, out
    assert run_info(pytester)["status"] == "completed"


@pytest.mark.parametrize("xdist", [False, True])
def test_keyboard_interrupt_in_a_task_interrupts_the_run_as_ctrl_c_does(pytester: pytest.Pytester, xdist: bool) -> None:
    body = """
class B(Base):
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1"), TaskSpec("t2"), TaskSpec("t3"), TaskSpec("slow")]
    async def run_task(self, task, prepared, env, req, plan):
        if task.task_id in ("t1", "t2", "t3"):  # several at once: still one interrupt, not a second and a third
            await asyncio.sleep(0.5)
            raise KeyboardInterrupt
        await asyncio.sleep(60 if task.task_id == "slow" else 0)
        return RunResult(task.task_id, output="ok")
"""
    setup(pytester, body)
    proc = start_pytest(pytester, "--junitxml=junit.xml", *(["-n", "2"] if xdist else []), own_group=True)
    out = finish(proc)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "slow" in out and "interrupted by the user" in out and "exiting now" not in out, out
    info = run_info(pytester)
    assert info["status"] == "interrupted" and "slow" in info["unfinished_tasks"], info  # type: ignore[operator]
    junit = (pytester.path / "junit.xml").read_text()
    assert junit.count("<testcase ") == 5, junit


@pytest.mark.parametrize("xdist", [False, True])
def test_ctrl_c_while_a_preflight_waits_records_every_task_cancelled(pytester: pytest.Pytester, xdist: bool) -> None:
    body = """
class H(BaseHarness):
    async def preflight(self, req):
        with open("preflight-started", "a") as started:  # the controller's and each worker's
            started.write("x ")
        await asyncio.sleep(60)
    async def run(self, session, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")

class Broken(H):
    async def preflight(self, req):
        raise RuntimeError("no model endpoint")

class B(BaseBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1")]
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""
    setup(pytester, body, harness={"id": "bench.py:H"})
    # A request whose own preflight failed before the Ctrl-C is reported and recorded as failed.
    broken = {"name": "a", "benchmark": {"id": "bench.py:B"}, "harness": {"id": "bench.py:Broken"}}
    request = {"name": "r", "benchmark": {"id": "bench.py:B"}, "harness": {"id": "bench.py:H"}}
    write_config(pytester, [broken, request], cleanup_grace_seconds=2.0)
    proc = start_pytest(pytester, "--junitxml=junit.xml", *(["-n", "2"] if xdist else []), own_group=True)
    started = pytester.path / "preflight-started"
    deadline = time.monotonic() + 60
    while not (started.exists() and len(started.read_text().split()) >= (3 if xdist else 1)):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the preflights never started"
        time.sleep(0.05)
    ctrl_c(proc)
    out = finish(proc)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "r: 2 tasks, 0 passed, 0 failed, 2 errors" in out, out
    info = run_info(pytester)
    assert info["status"] == "interrupted" and sorted(info["unfinished_tasks"]) == ["t0", "t1"], info  # type: ignore[call-overload]
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert not (run_dir / "run.lock").exists()
    junit = (pytester.path / "junit.xml").read_text()
    assert junit.count(">cancelled: interrupted by the user</error>") == 2 and junit.count("<testcase ") == 4, junit
    for task in ("t0", "t1"):  # in the short summary with its reason, as any erroring task
        assert f"ERROR agentcompass.yaml::r::{task} - cancelled: interrupted by the user" in out, out
    assert "a: 2 tasks, 0 passed, 0 failed, 2 errors" in out, out
    (failed_dir,) = (pytester.path / "runs/a").iterdir()
    assert json.loads((failed_dir / "run_info.json").read_text())["status"] == "failed"
    assert not (failed_dir / "run.lock").exists()


@pytest.mark.parametrize(
    ("cleanup", "xdist"),
    [
        # A cleanup that a second cancellation ends, and one that ignores every cancellation
        # (abandoned, it must stay so: not be closed at the process's exit, after the summary).
        ("finally:\n            await asyncio.sleep(30)", False),
        (NEVER_ENDS, False),
        (NEVER_ENDS, True),
    ],
    ids=["slow-finally", "never-ends", "never-ends-xdist"],
)
def test_a_cleanup_outlasting_the_grace_reports_each_task_once(
    pytester: pytest.Pytester, cleanup: str, xdist: bool
) -> None:
    body = f"""
class B(Base):
    def load_tasks(self, req):
        return [TaskSpec("t0"), TaskSpec("t1")]
    async def run_task(self, task, prepared, env, req, plan):
        open(task.task_id + "-started", "w").close()
        try:
            await asyncio.sleep(60)
        {cleanup}
        return RunResult(task.task_id, output="ok")
"""
    setup(pytester, body, grace=1.0)
    proc = start_pytest(pytester, "--junitxml=junit.xml", *(["-n", "2"] if xdist else []), own_group=True)
    for task in ("t0", "t1"):
        wait_for_file(proc, pytester.path / f"{task}-started")
    ctrl_c(proc)
    out = finish(proc)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert out.count("ERROR at setup of") == 2 and "cancelled: interrupted by the user" in out, out
    assert "internal error" not in out, out
    assert (pytester.path / "junit.xml").read_text().count("<testcase ") == 2
    assert run_info(pytester)["status"] == "interrupted"


@pytest.mark.parametrize(
    ("kind", "raising", "name"),
    [
        ("async", "raise asyncio.CancelledError()", "CancelledError"),
        # What real code does: it cancels something it started, then awaits it.
        (
            "async",
            "inner = asyncio.ensure_future(asyncio.sleep(10))\n"
            "            await asyncio.sleep(0)\n            inner.cancel()\n            await inner",
            "CancelledError",
        ),
        ("sync", "raise asyncio.CancelledError()", "CancelledError"),
        ("async", "raise GeneratorExit()", "GeneratorExit"),
        ("sync", "raise MyBase('mine')", "MyBase: mine"),
    ],
    ids=["cancelled", "awaits-what-it-cancelled", "cancelled-sync", "generator-exit", "own-class-sync"],
)
def test_a_base_exception_from_a_task_fails_that_task_alone(
    pytester: pytest.Pytester, kind: str, raising: str, name: str
) -> None:
    """A ``CancelledError`` the task was not cancelled with made it vanish (run passed, no record);
    the others ended the event loop (INTERNALERROR, every result lost)."""
    body = f"""
class MyBase(BaseException):
    pass

class B(Base):
    {"async " if kind == "async" else ""}def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "t1":
            {raising}
        return RunResult(task.task_id, output="ok")
"""
    setup(pytester, body)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", timeout=60)
    out = result.stdout.str() + result.stderr.str()
    for noise in (*NOISE, "KeyboardInterrupt"):
        assert noise not in out, out
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert f"B.run_task raised {name} (a BaseException, not an Exception): the task fails" in out, out
    result.assert_outcomes(passed=3, errors=1)
    assert run_info(pytester)["status"] == "completed"
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    detail = json.loads((run_dir / "details/t1.json").read_text())
    assert detail["status"] == "inference_error", detail


@pytest.mark.parametrize(
    ("where", "body"),
    [
        ("module", "sys.exit(5)\n"),
        ("load_tasks", "class B(Base):\n    def load_tasks(self, req):\n        sys.exit(4)\n"),
        ("select_tasks", "class B(Base):\n    def select_tasks(self, tasks, req):\n        sys.exit(1)\n"),
    ],
    ids=["module", "load_tasks", "select_tasks"],
)
def test_sys_exit_while_a_request_loads_is_its_collection_error(
    pytester: pytest.Pytester, where: str, body: str
) -> None:
    """pytest ended in INTERNALERROR ("mainloop: caught unexpected SystemExit!")."""
    pytester.makepyfile(bench=HEAD + body)
    good = "class G(Base):\n    async def run_task(self, *a):\n        return RunResult(a[0].task_id)\n"
    pytester.makepyfile(good=HEAD + good)
    requests = [{"name": "r", "benchmark": {"id": "bench.py:B"}}, {"name": "ok", "benchmark": {"id": "good.py:G"}}]
    write_config(pytester, requests)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", timeout=60)
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out and result.ret == pytest.ExitCode.INTERRUPTED, out
    result.stdout.fnmatch_lines(["*request 'r': loading tasks failed*", "*1 error during collection*"])
    assert "SystemExit: " in out, out
    assert f"in {where}" in out or where == "module", out


def test_a_task_concurrency_far_above_the_task_count_runs(pytester: pytest.Pytester) -> None:
    """It started one worker coroutine per unit of concurrency: a billion, for three tasks (a silent hang)."""
    body = """
class B(Base):
    async def run_task(self, task, prepared, env, req, plan):
        return RunResult(task.task_id, output="ok")
"""
    pytester.makepyfile(bench=HEAD + body)
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:B"}}], task_concurrency=10**9)
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=4)
