"""Ctrl-C on a real pytest process: the first cleans up within the grace, the second exits at once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import start_pytest, write_config

BENCH = """
import asyncio, dataclasses, os
from pytest_agentcompass import HarnessFreeBenchmark, LocalEnvironment, LocalSession, RunResult, TaskSpec

class Sleepy(HarnessFreeBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(6)]
    async def run_task(self, task, prepared, env, req, plan):
        with open(f"{os.getcwd()}/workers", "a") as out:  # which pytest process runs it
            out.write(f"{os.getpid()} ")
        await env.exec(["sh", "-c", f"echo $$ >> {os.getcwd()}/pids; sleep 60"])
        return RunResult(task.task_id, output="late")
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)

class StubbornSession(LocalSession):
    async def close(self):
        with open(f"{os.getcwd()}/closing", "a") as out:
            out.write("x")
        await asyncio.sleep(600)  # cleanup that never ends on its own (a test would time out first)
        await super().close()

class Stubborn(LocalEnvironment):
    async def open(self, config):
        base = await super().open(config)
        return StubbornSession(base.root)
"""


#: Runs started here; whatever a failed test leaves running is killed (a 120 s grace, on two cores).
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


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen[str], never: str) -> None:
    """Until ``condition`` holds, while ``proc`` runs (60 s at most: a guard against a hang, not a measurement)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, never
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)


def wait_for(path: Path, count: int, proc: subprocess.Popen[str]) -> None:
    """Until ``path`` holds ``count`` marks (the stubborn closes write one each as they start)."""
    wait_until(lambda: path.exists() and len(path.read_text()) >= count, proc, f"{path.name}: {count} never reached")


def ended_soon(proc: subprocess.Popen[str], signalled: float) -> str:
    """Its output; it had to end well before the grace (120 s) and the stubborn closes (600 s)."""
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - signalled < 40, out
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def start(
    pytester: pytest.Pytester,
    environment: dict[str, object],
    grace: float,
    *args: str,
    own_group: bool = False,
    running: int = 3,
    **top: object,
) -> subprocess.Popen[str]:
    """A run of six tasks that sleep, returned once ``running`` of them run (``task_concurrency`` is that)."""
    pytester.makepyfile(bench=BENCH)
    ws = pytester.path / "ws"
    ws.mkdir()
    write_config(
        pytester,
        [
            {
                "name": "r",
                "benchmark": {"id": "bench.py:Sleepy"},
                "environment": {**environment, "params": {"base_dir": str(ws)}},
            }
        ],
        task_concurrency=running,
        cleanup_grace_seconds=grace,
        **top,
    )
    proc = start_pytest(pytester, *args, own_group=own_group)
    STARTED.append(proc)
    pids = pytester.path / "pids"
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) >= running, proc, "tasks never started")
    return proc


def assert_ended_cleanly(pytester: pytest.Pytester, out: str, status: str) -> None:
    """Quiet; every task reported and recorded unfinished; the run released; no process or workspace left."""
    for noise in ("Traceback", "Task was destroyed", "Exception ignored", "INTERNALERROR"):
        assert noise not in out, out
    assert "r: 6 tasks, 0 passed, 0 failed, 6 errors" in out, out
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == status and sorted(info["unfinished_tasks"]) == [f"t{i}" for i in range(6)]
    # In process as under xdist: the summary and the run say what the next run does with it.
    resumes = [n for n in info["notes"] if n.startswith(f"{status}: ") and n.endswith("; the next run resumes it")]
    assert len(resumes) == 1, info["notes"]
    assert f"  note: {resumes[0]}" in out, out
    assert not (run_dir / "run.lock").exists()
    for pid in (int(p) for p in (pytester.path / "pids").read_text().split()):
        assert not alive(pid)
    assert list((pytester.path / "ws").iterdir()) == [], "workspaces survived"


def test_first_interrupt_cleans_up_everything(pytester: pytest.Pytester) -> None:
    proc = start(pytester, {"id": "local"}, grace=20)
    pids = [int(p) for p in (pytester.path / "pids").read_text().split()]
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=20)  # well within the grace
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "interrupted, cleaning up" in out
    assert "cancelled: interrupted by the user" in out
    assert not [pid for pid in pids if alive(pid)], "agent processes survived"
    assert list((pytester.path / "ws").iterdir()) == [], "workspaces survived"
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "interrupted" and sorted(info["unfinished_tasks"]) == [f"t{i}" for i in range(6)]


def test_second_interrupt_exits_at_once(pytester: pytest.Pytester) -> None:
    proc = start(pytester, {"id": "bench.py:Stubborn"}, grace=120)
    proc.send_signal(signal.SIGINT)
    wait_for(pytester.path / "closing", 3, proc)  # the first cleanup waits on the stubborn closes
    assert proc.poll() is None  # still waiting on the stubborn cleanup, within its grace
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out
    for pid in (int(p) for p in (pytester.path / "pids").read_text().split()):
        assert not alive(pid)  # exec's own cleanup already ran before close hung
    # Exiting at once skips the waits, not the bookkeeping, and says nothing it should not.
    for noise in ("Task was destroyed", "Event loop is closed", "Context", "Exception ignored", "INTERNALERROR"):
        assert noise not in out, out
    assert "agentcompass.yaml EEEEEE" in out and "r: 6 tasks, 0 passed, 0 failed, 6 errors" in out, out
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["status"] == "interrupted" and sorted(info["unfinished_tasks"]) == [f"t{i}" for i in range(6)]
    assert not (run_dir / "run.lock").exists()
    assert list((pytester.path / "ws").iterdir()) == [], "the stuck sessions' workspaces were swept"


@pytest.mark.parametrize("second", ["once the agents are stopped", "once the cleanup waits"])
def test_a_second_interrupt_under_xdist_exits_at_once_and_keeps_the_bookkeeping(
    pytester: pytest.Pytester, second: str
) -> None:
    proc = start(pytester, {"id": "bench.py:Stubborn"}, 120, "--junitxml=junit.xml", "-n", "2", own_group=True)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it: to xdist's workers too
    # Not before every worker running a task has taken the first (two signals not yet handled are one).
    if second == "once the agents are stopped":
        pids = [int(p) for p in (pytester.path / "pids").read_text().split()]
        wait_until(lambda: not any(alive(pid) for pid in pids), proc, "the agents never stopped")
    else:
        wait_for(pytester.path / "closing", 3, proc)  # every stubborn close has started
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)  # the grace is 120 s: only the second Ctrl-C ends it this soon
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    for noise in ("Traceback", "Task was destroyed", "Exception ignored", "INTERNALERROR"):
        assert noise not in out, out
    assert "r: 6 tasks, 0 passed, 0 failed, 6 errors" in out, out
    assert (pytester.path / "junit.xml").read_text().count("<testcase ") == 6
    (run_dir,) = (pytester.path / "runs/r").iterdir()
    assert json.loads((run_dir / "run_info.json").read_text())["status"] == "interrupted"
    assert not (run_dir / "run.lock").exists()
    for pid in (int(p) for p in (pytester.path / "pids").read_text().split()):
        assert not alive(pid)
    assert list((pytester.path / "ws").iterdir()) == [], "the stuck sessions' workspaces were swept"


@pytest.mark.parametrize(
    ("environment", "xdist", "whom"),
    [
        ({"id": "bench.py:Stubborn"}, False, "group"),
        ({"id": "bench.py:Stubborn"}, True, "group"),
        # A CI job's cancel: Ctrl-C, then SIGTERM while the first cleanup waits on the stubborn ones.
        ({"id": "bench.py:Stubborn"}, False, "group-after-ctrl-c"),
        ({"id": "bench.py:Stubborn"}, True, "group-after-ctrl-c"),
        # kill <pid> under xdist: the controller alone; its workers cancel as on its Ctrl-C.
        ({"id": "local"}, True, "controller"),
    ],
    ids=["in-process", "xdist", "in-process-after-ctrl-c", "xdist-after-ctrl-c", "xdist-controller-alone"],
)
def test_sigterm_ends_the_run_soon_and_keeps_the_bookkeeping(
    pytester: pytest.Pytester, environment: dict[str, object], xdist: bool, whom: str
) -> None:
    """What `timeout` or a cancelled CI job sends, SIGKILL a few seconds behind: no 120 s grace is waited out."""
    args = ("--junitxml=junit.xml", *(("-n", "2") if xdist else ()))
    # Under xdist all six run, so both workers are in their task loop (where they take signals) before the signal.
    proc = start(pytester, environment, 120, *args, own_group=True, running=6 if xdist else 3)
    if xdist:
        assert len(set((pytester.path / "workers").read_text().split())) == 2
    if whom.endswith("after-ctrl-c"):
        os.killpg(proc.pid, signal.SIGINT)
        wait_for(pytester.path / "closing", 6 if xdist else 3, proc)  # the first cleanup waits on the stubborn ones
    signalled = time.monotonic()
    if whom.startswith("group"):
        os.killpg(proc.pid, signal.SIGTERM)  # as `timeout` sends it: to xdist's workers too
    else:
        proc.send_signal(signal.SIGTERM)
    out = ended_soon(proc, signalled)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "terminated (SIGTERM)" in out, out
    assert (pytester.path / "junit.xml").read_text().count("<testcase ") == 6
    assert_ended_cleanly(pytester, out, "interrupted")


@pytest.mark.parametrize("xdist", [False, True], ids=["in-process", "xdist"])
def test_a_ctrl_c_while_the_deadlines_cleanup_waits_ends_it_and_keeps_the_bookkeeping(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    """It cancelled the orchestration a second time, inside that cleanup: nothing recorded, run_info `running`."""
    running = 6 if xdist else 3
    proc = start(
        pytester,
        {"id": "bench.py:Stubborn"},
        120,
        *(["-n", "2"] if xdist else []),
        own_group=True,
        running=running,
        timeout_seconds=8,
    )
    wait_for(pytester.path / "closing", running, proc)  # the deadline passed; its cleanup waits on the stubborn ones
    signalled = time.monotonic()
    if xdist:
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it
    else:
        proc.send_signal(signal.SIGINT)
    out = ended_soon(proc, signalled)
    assert proc.returncode == (pytest.ExitCode.INTERRUPTED if xdist else pytest.ExitCode.TESTS_FAILED), out
    assert_ended_cleanly(pytester, out, "interrupted" if xdist else "timeout")
