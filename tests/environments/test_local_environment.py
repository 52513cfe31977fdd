"""The local provider: real subprocesses, real process groups, a confined workspace."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from pytest_agentcompass import EnvironmentSpec, ExecutionPlan, LocalEnvironment, PolicyError, WorkspacePathError
from pytest_agentcompass.environments.local import LocalSession
from pytest_agentcompass.vocabulary.errors import SessionError


def plan(**policies: str) -> ExecutionPlan:
    return ExecutionPlan(task_id="t", attempt_index=0, evaluation_environment_mode="reuse", **policies)  # type: ignore[arg-type]


async def open_session(tmp_path: Path, **params: object) -> LocalSession:
    provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path), **params}))
    session = await provider.open(provider.build_config(plan(), "task"))
    assert isinstance(session, LocalSession)
    return session


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_exec_captures_output_and_exit_code(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        result = await session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"], env={"X": "1"})
        assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
        assert (await session.exec(["sh", "-c", "pwd"])).stdout.strip() == str(session.root)
        await session.close()

    asyncio.run(main())


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        started = time.monotonic()
        # A child that ignores the parent's death and would hold the pipes open.
        result = await session.exec(["sh", "-c", "sleep 60 & echo $! > child.pid; wait"], timeout=0.5)
        assert time.monotonic() - started < 10
        assert result.timed_out
        child = int((session.root / "child.pid").read_text())
        for _ in range(50):
            if not alive(child):
                break
            await asyncio.sleep(0.05)
        assert not alive(child)
        await session.close()

    asyncio.run(main())


def test_background_children_do_not_outlive_a_successful_exec(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        result = await session.exec(["sh", "-c", "(sleep 60 &) ; echo $$ > leader.pid"], timeout=10)
        assert result.exit_code == 0
        out = await session.exec(["sh", "-c", "ps -eo pgid,pid,cmd | grep 'sleep 60' | grep -v grep || true"])
        leader = (session.root / "leader.pid").read_text().strip()
        assert not [line for line in out.stdout.splitlines() if line.split()[0] == leader]
        await session.close()

    asyncio.run(main())


def test_cancelling_exec_kills_the_process(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        task = asyncio.ensure_future(session.exec(["sh", "-c", "echo $$ > pid; sleep 60"]))
        while not (session.root / "pid").exists() or not (session.root / "pid").read_text().strip():
            await asyncio.sleep(0.02)
        pid = int((session.root / "pid").read_text())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if not alive(pid):
                break
            await asyncio.sleep(0.05)
        assert not alive(pid)
        await session.close()

    asyncio.run(main())


def test_output_is_truncated_and_flagged(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path, output_limit=1000)
        result = await session.exec([sys.executable, "-c", "print('x' * 100000)"])
        assert len(result.stdout) == 1000 and result.stdout_truncated and not result.stderr_truncated
        await session.close()

    asyncio.run(main())


def test_paths_are_confined_to_the_workspace(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        await session.write_text("/tmp/submission.patch", "diff")
        assert (session.root / "tmp/submission.patch").read_text() == "diff"
        assert await session.read_text("tmp/submission.patch") == "diff"
        for escape in ["../outside.txt", "/../../etc/passwd", "a/../../b"]:
            with pytest.raises(WorkspacePathError, match="outside the workspace"):
                await session.write_text(escape, "x")
        os.symlink("/etc", session.root / "link")
        with pytest.raises(WorkspacePathError):
            await session.read_text("link/passwd")
        # A single name is checked too (it takes a shorter path than a nested one).
        os.symlink("/etc/hostname", session.root / "name")
        for attempt in (session.read_text("name"), session.write_text("name", "x")):
            with pytest.raises(WorkspacePathError, match="outside the workspace"):
                await attempt
        os.symlink("inside.txt", session.root / "alias")  # a link that stays inside is fine
        await session.write_text("alias", "kept")
        assert (session.root / "inside.txt").read_text() == "kept"
        with pytest.raises(WorkspacePathError):
            await session.exec(["true"], cwd="../")
        await session.close()

    asyncio.run(main())


def test_a_root_a_command_replaced_by_a_symlink_leads_nowhere(tmp_path: Path) -> None:
    """Commands run with HOME set to the workspace: ``rm -rf ~; ln -s /elsewhere ~`` must not open a way out."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    session = LocalSession(parent=tmp_path / "ws")
    session.resolve(".")
    shutil.rmtree(session.root)
    os.symlink(outside, session.root)
    for path in ("secret", "./secret", "."):
        with pytest.raises(WorkspacePathError):
            session.resolve(path)


def test_a_workspace_a_command_removed_is_made_again_by_a_write(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        await session.write_text("a.txt", "1")
        shutil.rmtree(session.root)
        await session.write_text("b.txt", "2")
        assert (session.root / "b.txt").read_text() == "2"
        (session.root / "dir").mkdir()
        with pytest.raises(SessionError, match="cannot write 'dir' in workspace"):
            await session.write_text("dir", "3")  # a folder is in the way: said, not a raw OSError
        await session.close()
        assert not session.root.exists()

    asyncio.run(main())


def test_close_is_idempotent_and_removes_the_workspace(tmp_path: Path) -> None:
    async def main() -> None:
        provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path)}))
        session = await provider.open(provider.build_config(plan(), "task"))
        await session.write_text("f", "x")
        await session.write_text("d/g", "y")  # not flat: removed, not kept for the next session
        await session.close()
        await session.close()
        assert not Path(session.describe()).exists()
        await provider.aclose()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []


def test_missing_program_is_an_exec_result_not_a_crash(tmp_path: Path) -> None:
    async def main() -> None:
        session = await open_session(tmp_path)
        result = await session.exec(["definitely-not-a-program-xyz"])
        assert result.exit_code == 127 and "cannot run" in result.stderr
        await session.close()

    asyncio.run(main())


@pytest.mark.parametrize("phase", ["baseline_network_policy", "run_network_policy", "evaluation_network_policy"])
def test_network_policy_other_than_full_is_rejected_at_plan_time(phase: str) -> None:
    provider = LocalEnvironment(EnvironmentSpec())
    with pytest.raises(PolicyError, match="does not support network policy 'disabled'"):
        provider.build_config(plan(**{phase: "disabled"}), "task")


def test_sweep_removes_workspaces_of_one_run_only(tmp_path: Path) -> None:
    provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path)}))

    async def main() -> int:
        for run in ("dead-run", "dead-run", "other-run"):
            session = await provider.open(provider.build_config(plan(), "task", {"agentcompass.run": run}))
            await session.write_text("f", "x")  # never closed, as by a SIGKILLed process
        return await provider.sweep("dead-run")

    assert asyncio.run(main()) == 2
    assert [p.name.split("-t-")[0] for p in tmp_path.iterdir()] == ["agentcompass-other-run"]
