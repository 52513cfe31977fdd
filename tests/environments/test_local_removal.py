"""Removing ``local`` workspaces: small flat ones by a listing, others by a walk, on a few threads, failures reported.

A removal that fails for real (an immutable directory as root, a read-only
one otherwise) must become the task's cleanup error, shown as its teardown
error, with the result kept; and every workspace is gone when the run ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from pytest_agentcompass.environments.local import LocalSession
from pytest_agentcompass.environments.workspaces import FLAT_REMOVAL_ENTRIES, InlineRemoval
from pytest_agentcompass.vocabulary.errors import SessionError

from conftest import start_pytest, write_config
from local_workspaces import local_provider, lock, locked, open_session, unlock


def test_removals_leave_the_loop_for_threads_while_the_disk_is_slow_and_come_back() -> None:
    choice = InlineRemoval()
    assert choice.wanted(), "a quick disk (or none measured yet): inline"
    for _ in range(20):
        choice.took(0.001)
    assert choice.wanted(), "1 ms per removal is still inline"
    for _ in range(20):
        choice.took(0.02)
    decisions = [choice.wanted() for _ in range(2 * InlineRemoval.PROBE)]
    assert decisions.count(True) == 2, "slow: threads, with one inline probe every PROBE removals"
    for _ in range(30):
        choice.took(0.00005)
    assert choice.wanted(), "the disk calmed down: inline again"


def test_a_session_never_used_creates_and_removes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        await session.close()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shape", ["flat", "nested", "many"])
def test_close_removes_the_whole_workspace(tmp_path: Path, shape: str) -> None:
    files = {
        "flat": ["a", "b"],
        "nested": ["a", "d/e/f", "d/g"],
        "many": [f"f{i}" for i in range(FLAT_REMOVAL_ENTRIES + 5)],
    }[shape]

    async def main() -> None:
        provider = local_provider(tmp_path)
        session = await open_session(provider)
        for name in files:
            await session.write_text(name, "x")
        os.symlink("/etc", session.root / "link")  # removed as a link, never followed
        await session.close()
        # A small flat one is kept, emptied, for the next session: until the provider closes.
        if shape == "flat":
            (kept,) = tmp_path.iterdir()
            assert kept == session.root and list(kept.iterdir()) == []
        else:
            assert list(tmp_path.iterdir()) == []
        await provider.aclose()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []
    assert Path("/etc/passwd").exists()


@pytest.mark.parametrize("where", ["root", "subdirectory"])
def test_a_removal_failure_raises_naming_what_stays(tmp_path: Path, where: str) -> None:
    provider = local_provider(tmp_path)

    async def main() -> LocalSession:
        session = await open_session(provider)
        await session.write_text("sub/kept.txt" if where == "subdirectory" else "kept.txt", "x")
        target = session.root / "sub" if where == "subdirectory" else session.root
        with locked(target):
            with pytest.raises(SessionError, match=r"was not removed: .*kept\.txt"):
                await session.close()
        return session

    session = asyncio.run(main())

    async def again() -> None:
        # Once the file system lets go, a second close finishes the job.
        await session.close()
        await provider.aclose()

    asyncio.run(again())
    assert list(tmp_path.iterdir()) == []


SUITE = """
import os, subprocess
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class B(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec("stuck"), TaskSpec("big"), TaskSpec("small")]
    async def run_task(self, task, prepared, env, req, plan):
        if task.task_id == "stuck":
            await env.write_text("sub/kept.txt", "x")
            sub = str(env.resolve("sub"))
            if os.geteuid() == 0:
                subprocess.run(["chattr", "+i", sub], check=True)
            else:
                os.chmod(sub, 0o500)
            with open(os.path.join(os.environ["LOCKED_LIST"], "locked"), "w") as out:
                out.write(sub)
        elif task.task_id == "big":
            for i in range(40):
                await env.write_text(f"d{i % 4}/f{i}", "x")
        else:
            await env.write_text("answer.txt", "42")
        return RunResult(task.task_id, output="ok")
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return RunResult(task.task_id, output=result.output, score=1.0)
"""


def test_a_workspace_that_cannot_be_removed_is_its_tasks_teardown_error(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    lock(probe)  # skips where the file system cannot refuse a removal
    unlock(probe)
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    monkeypatch.setenv("LOCKED_LIST", str(tmp_path))
    pytester.makepyfile(bench=SUITE)
    environment = {"id": "local", "params": {"base_dir": str(workspaces)}}
    write_config(pytester, [{"name": "r", "benchmark": {"id": "bench.py:B"}, "environment": environment}])
    try:
        result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    finally:
        locked_list = tmp_path / "locked"
        if locked_list.exists():
            unlock(Path(locked_list.read_text()))
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of r::stuck*",
            "*cleanup failed (the task's own result is kept)*",
            "*closing the task environment *: SessionError: workspace * was not removed: *kept.txt*",
        ]
    )
    (detail,) = (pytester.path / "runs/r").glob("*/details/stuck.json")
    data = json.loads(detail.read_text())
    assert data["score"] == 1.0 and data["status"] == "scored"
    assert "was not removed" in data["cleanup_errors"][0]
    # Only the workspace that could not be removed is left when the session has ended.
    (left,) = workspaces.iterdir()
    assert "-stuck-" in left.name and (left / "sub/kept.txt").exists()


WRITERS = """
import asyncio, os
from pytest_agentcompass import HarnessFreeBenchmark, RunResult, TaskSpec

class Writers(HarnessFreeBenchmark):
    evaluation_environment_mode = "none"
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(12)]
    async def run_task(self, task, prepared, env, req, plan):
        await env.write_text("answer.txt", task.task_id)
        assert sorted(os.listdir(env.resolve("."))) == ["answer.txt"], "a reused workspace starts empty"
        with open(os.path.join(os.environ["WRITERS_DIR"], task.task_id), "w"):
            pass  # the test waits for these before it interrupts
        while os.path.exists(os.environ["WRITERS_HANG"]) and int(task.task_id[1:]) >= 10:
            await asyncio.sleep(0.05)
        return RunResult(task.task_id, output="ok")
    async def evaluate(self, task, prepared, result, req, plan, env=None):
        return RunResult(task.task_id, output=result.output, score=1.0)
"""


@pytest.mark.parametrize("ending", ["completed", "ctrl-c"])
def test_no_workspace_outlives_a_distributed_run(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """Every worker's provider removes what it kept for reuse, also when the run is interrupted."""
    workspaces_dir, started, hang = tmp_path / "workspaces", tmp_path / "started", tmp_path / "hang"
    workspaces_dir.mkdir()
    started.mkdir()
    if ending == "ctrl-c":
        hang.touch()
    monkeypatch.setenv("WRITERS_DIR", str(started))
    monkeypatch.setenv("WRITERS_HANG", str(hang))
    pytester.makepyfile(writers=WRITERS)
    environment = {"id": "local", "params": {"base_dir": str(workspaces_dir)}}
    write_config(
        pytester,
        [{"name": "w", "benchmark": {"id": "writers.py:Writers"}, "environment": environment}],
        task_concurrency=4,
    )
    proc = start_pytest(pytester, "-n", "2", own_group=True)
    try:
        if ending == "ctrl-c":
            deadline = time.monotonic() + 60  # a guard against a hang, not a measurement
            # Every task started: ten ended, two (t10, t11) hang in their workspaces.
            while len(list(started.iterdir())) < 12 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            assert len(list(started.iterdir())) == 12, "the hanging tasks never started"
            os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    expected = pytest.ExitCode.OK if ending == "completed" else pytest.ExitCode.INTERRUPTED
    assert proc.returncode == expected, out
    assert "12 passed" in out if ending == "completed" else "Traceback" not in out, out
    assert list(workspaces_dir.iterdir()) == [], out
