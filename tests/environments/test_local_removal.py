"""Removing ``local`` workspaces: small flat ones by a listing, others by a walk, on a few threads, failures reported.

A removal that fails for real (an immutable directory as root, a read-only
one otherwise) must become the task's cleanup error, shown as its teardown
error, with the result kept; and every workspace is gone when the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_agentcompass import EnvironmentSpec, ExecutionPlan, LocalEnvironment
from pytest_agentcompass.environments import process, workspaces
from pytest_agentcompass.environments.local import LocalSession
from pytest_agentcompass.environments.workspaces import FLAT_REMOVAL_ENTRIES, InlineRemoval
from pytest_agentcompass.errors import SessionError

from conftest import start_pytest, write_config


def lock(directory: Path) -> None:
    """Make unlinking entries of ``directory`` fail: immutable as root (who ignores modes), read-only otherwise."""
    if os.geteuid() != 0:
        directory.chmod(0o500)
        return
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this file system cannot make a directory immutable: {done.stderr.strip()}")


def unlock(directory: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], capture_output=True, check=False)
    else:
        directory.chmod(0o700)


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    lock(directory)
    try:
        yield
    finally:
        unlock(directory)


def local_provider(base: Path) -> LocalEnvironment:
    return LocalEnvironment(EnvironmentSpec(params={"base_dir": str(base)}))


async def open_session(base: Path | LocalEnvironment) -> LocalSession:
    provider = base if isinstance(base, LocalEnvironment) else local_provider(base)
    plan = ExecutionPlan(task_id="t", attempt_index=0, evaluation_environment_mode="reuse")
    session = await provider.open(provider.build_config(plan, "task"))
    assert isinstance(session, LocalSession)
    return session


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


@pytest.mark.parametrize("where", ["event loop", "removal thread"])
def test_an_emptied_workspace_is_renamed_into_the_next_one(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename instead of an ``rmdir`` and a ``mkdir``: one inode serves session after session, empty each time."""
    slow = where == "removal thread"  # a slow disk: no removal on the loop; else a quick one, whatever came before
    monkeypatch.setattr(workspaces.inline_removal, "mean", 1.0 if slow else 0.0)
    monkeypatch.setattr(workspaces.inline_removal, "skipped", -1000 if slow else 0)

    async def main() -> None:
        provider = local_provider(tmp_path)
        first = await open_session(provider)
        await first.write_text("a.txt", "1")
        inode = first.root.stat().st_ino
        await first.close()
        second = await open_session(provider)
        assert not second.root.exists(), "named on first use, not before"
        await second.write_text("b.txt", "2")
        assert second.root != first.root and not first.root.exists()
        assert second.root.stat().st_ino == inode
        assert sorted(p.name for p in second.root.iterdir()) == ["b.txt"]
        assert stat.S_IMODE(second.root.stat().st_mode) == 0o700
        assert (await second.exec(["sh", "-c", "pwd; cat b.txt"])).stdout == f"{second.root}\n2"
        await second.close()
        await second.close()  # again: nothing more happens
        assert [p.stat().st_ino for p in tmp_path.iterdir()] == [inode]
        await provider.aclose()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change", ["opened up", "replaced", "replaced by a link"])
def test_a_workspace_that_is_not_as_it_was_made_is_removed_not_kept(tmp_path: Path, change: str) -> None:
    async def main() -> None:
        provider = local_provider(tmp_path)
        session = await open_session(provider)
        await session.write_text("a.txt", "1")
        root = session.root
        elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
        if change == "opened up":
            root.chmod(0o755)
        elif change == "replaced":  # the original moved away, so its inode number cannot come back
            root.rename(elsewhere)
            root.mkdir(mode=0o700)
            (root / "b.txt").write_text("2")
        elif change == "replaced by a link":
            root.rename(elsewhere)
            root.symlink_to(elsewhere)
        await session.close()
        assert list(tmp_path.iterdir()) == [], "removed at close, nothing kept"
        if change.startswith("replaced"):
            assert (elsewhere / "a.txt").exists(), "the link was removed, not followed"
            shutil.rmtree(elsewhere)
        await provider.aclose()

    asyncio.run(main())


def keep(spares: workspaces.Spares, folder: Path) -> bool:
    return spares.offer(str(folder), folder.stat(), workspaces.identity(folder))


def test_only_a_private_directory_of_ours_is_kept(tmp_path: Path) -> None:
    spares = workspaces.Spares()
    folder = tmp_path / "w"
    folder.mkdir(mode=0o700)
    made = workspaces.identity(folder)
    assert not spares.offer(str(folder), folder.stat(), (0, 0)), "not the directory the session made"
    assert not spares.offer(str(folder), folder.stat(), None)
    folder.chmod(0o755)
    assert not spares.offer(str(folder), folder.stat(), made), "not private"
    folder.chmod(0o700)
    assert spares.offer(str(folder), folder.stat(), made) and len(spares) == 1
    assert spares.take(tmp_path / "next") and (tmp_path / "next").is_dir() and not folder.exists()
    assert not spares.take(tmp_path / "another"), "none left"


@pytest.mark.parametrize(
    "change", ["a file", "opened up", "an attribute of its own", "a folder it cannot empty", "a FIFO", "a file instead"]
)
def test_a_spare_that_changed_while_kept_is_never_handed_out(tmp_path: Path, change: str) -> None:
    """What a process that outlived its task did there: the spare is set aside, removed later, off the loop."""
    spares = workspaces.Spares()
    folder = tmp_path / "agentcompass-run-t-kept"
    folder.mkdir(mode=0o700)
    assert keep(spares, folder)
    if change == "a file":
        (folder / "stale.txt").write_text("from a survivor")
    elif change == "opened up":
        folder.chmod(0o755)
    elif change == "an attribute of its own":  # a default ACL is one
        try:
            os.setxattr(folder, "user.left", b"by the task before")
        except OSError:
            pytest.skip("this file system has no user attributes")
    elif change == "a folder it cannot empty":
        (folder / "sub").mkdir()
        (folder / "sub" / "planted.txt").write_text("x")
        lock(folder / "sub")
    elif change == "a FIFO":  # rmtree would open it and wait for a writer
        folder.rmdir()
        os.mkfifo(folder)
    else:
        folder.rmdir()
        folder.write_text("not a folder")
    target = tmp_path / "agentcompass-run-t2-next"
    try:
        assert not spares.take(target), change
        assert not target.exists() and not target.is_symlink(), "the new name is free for a new folder"
        (aside,) = [p for p in tmp_path.iterdir()]
        assert aside.name.startswith(target.name + ".stale-"), "set aside under the run's prefix, for the sweep"
        if change == "a folder it cannot empty":
            with pytest.raises(SessionError, match=r"was not removed: .*planted\.txt"):
                workspaces.remove_spares(spares.close())
            unlock(aside / "sub")
            workspaces.remove_workspace(aside)
        else:
            workspaces.remove_spares(spares.close())
    finally:
        for left in tmp_path.rglob("sub"):
            unlock(left)
    assert list(tmp_path.iterdir()) == []


def test_a_session_never_gets_a_folder_that_was_there_before(tmp_path: Path) -> None:
    """Its name is new: a folder in its place (made by someone else) is an error, not its workspace."""

    async def main() -> None:
        provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path), "reuse_workspaces": False}))
        session = await open_session(provider)
        session.root.mkdir(mode=0o700)
        (session.root / "planted.txt").write_text("x")
        with pytest.raises(SessionError, match=r"cannot make workspace .*: File exists"):
            await session.write_text("a.txt", "1")
        shutil.rmtree(session.root)
        await session.close()
        await provider.aclose()

    asyncio.run(main())


def test_an_aclose_cut_short_still_keeps_nothing_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grace ran out while the removal threads were busy: the spares stop at once, their removal goes on."""
    release = threading.Event()
    # The closes below remove on the loop: every removal thread is kept busy on purpose. (Whether a
    # removal runs inline depends on how slow earlier ones in this process were: a busy disk made
    # the second close wait for those threads, and the test hung.)
    monkeypatch.setattr(InlineRemoval, "LIMIT", math.inf)

    async def main() -> None:
        provider = local_provider(tmp_path)
        first, second = await open_session(provider), await open_session(provider)
        for session in (first, second):
            await session.write_text("a.txt", "1")
        await first.close()
        busy = [workspaces.removal_pool().submit(release.wait) for _ in range(workspaces.REMOVAL_THREADS)]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(provider.aclose(), 0.1)
        await asyncio.wait_for(second.close(), 30)  # after the cut-short aclose: removed, not kept
        assert [p.name for p in tmp_path.iterdir()] == [first.root.name], "only the spare waiting for its removal"
        release.set()
        for call in busy:
            call.result(timeout=30)
        assert workspaces.removal_pool().drain(30) == []

    try:
        asyncio.run(main())
    finally:
        release.set()
    assert list(tmp_path.iterdir()) == []


def test_a_close_after_the_provider_closed_keeps_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        provider = local_provider(tmp_path)
        session = await open_session(provider)
        await session.write_text("a.txt", "1")
        await provider.aclose()  # no spare yet: a close still to come (a cancelled task's) must not keep one
        await session.close()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []


def test_reuse_can_be_turned_off(tmp_path: Path) -> None:
    async def main() -> None:
        provider = LocalEnvironment(EnvironmentSpec(params={"base_dir": str(tmp_path), "reuse_workspaces": False}))
        session = await open_session(provider)
        await session.write_text("a.txt", "1")
        await session.close()
        assert list(tmp_path.iterdir()) == []
        await provider.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("when", ["running at close", "timed out before"])
def test_a_workspace_whose_commands_may_live_on_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A reaper that does not answer in time: a process may still work in the directory, so it is removed."""
    monkeypatch.setattr(process, "_KILL_WAIT", 0.3)
    stopped: list[int] = []

    async def main() -> None:
        provider = local_provider(tmp_path)
        session = await open_session(provider)
        await session.write_text("a.txt", "1")
        timeout = 1.0 if when == "timed out before" else None
        running = asyncio.ensure_future(session.exec(["sh", "-c", "echo started; exec sleep 30"], timeout=timeout))
        deadline = time.monotonic() + 30  # a guard against a hang, not a measurement
        while not stopped and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            reapers = [p for p in process.descendants(os.getpid()) if _is_exec_reaper(p)]
            for pid in reapers:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        assert stopped, "the exec's reaper never appeared"
        if when == "timed out before":
            assert (await running).timed_out  # its reaper never said it is done
        try:
            await session.close()
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):  # a stopped reaper is killed by the close
                    os.kill(pid, signal.SIGCONT)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        assert list(tmp_path.iterdir()) == [], "removed at close, not kept"
        await provider.aclose()

    asyncio.run(main())


def _is_exec_reaper(pid: int) -> bool:
    """A per-exec reaper: a ``_reaper.py`` process with a command of its own (the server has reapers as children)."""
    try:
        if b"_reaper.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
        return any(
            b"_reaper.py" not in Path(f"/proc/{child}/cmdline").read_bytes() for child in process.descendants(pid)
        )
    except OSError:
        return False


def test_spares_are_few_and_none_is_kept_once_the_provider_closed(tmp_path: Path) -> None:
    async def main() -> None:
        provider = local_provider(tmp_path)
        sessions = [await open_session(provider) for _ in range(workspaces.Spares.LIMIT + 3)]
        for session in sessions:
            await session.write_text("a.txt", "1")
        for session in sessions:
            await session.close()
        assert len(list(tmp_path.iterdir())) == workspaces.Spares.LIMIT
        late = await open_session(provider)
        await late.write_text("a.txt", "1")  # takes a spare
        await provider.aclose()
        assert list(tmp_path.iterdir()) == [late.root]
        await late.close()  # a session closing after its provider: removed, not kept

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []


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


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[Path]:
    """Host data a command mounts into its workspace; whatever stays mounted under ``tmp_path`` is detached after.

    Skips where this process may not mount (not root, or no ``mount``).
    """
    data = tmp_path / "precious"
    (data / "sub").mkdir(parents=True)
    (data / "keep.txt").write_text("host data")
    (data / "sub" / "deep.txt").write_text("host data")
    probe = tmp_path / "probe"
    probe.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("bind mounts need root and mount(8)")
    done = subprocess.run(["mount", "--bind", str(data), str(probe)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.strip()}")
    subprocess.run(["umount", str(probe)], check=True)
    try:
        yield data
    finally:
        for point in workspaces.mount_points(tmp_path):
            subprocess.run(["umount", "-l", os.fsdecode(point)], check=False)


def intact(data: Path) -> bool:
    return (data / "keep.txt").read_text() == "host data" and (data / "sub" / "deep.txt").read_text() == "host data"


MOUNTS = {
    "a subdirectory": "mkdir cache && mount --bind {data} cache",
    "the workspace itself": "mount --bind {data} .",
    "a file": "touch notes && mount --bind {data}/keep.txt notes",
    "nested": "mkdir -p a/b && mount --bind {data} a && mkdir -p a/sub/in && mount --bind {data} a/sub/in",
}


@pytest.mark.parametrize("where", list(MOUNTS))
def test_a_mount_in_a_workspace_is_detached_never_emptied(tmp_path: Path, victim: Path, where: str) -> None:
    """A command (root) bind-mounts host data into its workspace: the close detaches it, the data stays."""
    base = tmp_path / "ws"
    base.mkdir()

    async def main() -> None:
        provider = local_provider(base)
        session = await open_session(provider)
        await session.write_text("answer.txt", "42")
        done = await session.exec(["sh", "-c", MOUNTS[where].format(data=victim)])
        assert done.exit_code == 0, done.stderr
        await session.close()  # before: emptied the host directory, then "Device or resource busy"
        assert list(base.iterdir()) == [], "removed, and not kept for reuse"
        await provider.aclose()

    asyncio.run(main())
    assert intact(victim)
    assert workspaces.mount_points(base) == []


def test_a_mount_that_cannot_be_detached_is_named_and_nothing_is_removed(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No right to detach (``EPERM``): one clear error naming the mount point, the workspace and the data stay."""
    base = tmp_path / "ws"
    base.mkdir()
    monkeypatch.setattr(workspaces, "_detach", lambda point: errno.EPERM)

    async def main() -> LocalSession:
        provider = local_provider(base)
        session = await open_session(provider)
        await session.write_text("answer.txt", "42")
        done = await session.exec(["sh", "-c", f"mkdir cache && mount --bind {victim} cache"])
        assert done.exit_code == 0, done.stderr
        pattern = r"holds a mount point that cannot be detached: .*/cache \(Operation not permitted\): not removed"
        with pytest.raises(SessionError, match=pattern):
            await session.close()
        assert intact(victim)
        assert (session.root / "answer.txt").exists(), "nothing removed beneath or beside it"
        await provider.aclose()
        assert list(base.iterdir()) == [session.root], "not kept for reuse"
        return session

    session = asyncio.run(main())
    monkeypatch.undo()
    subprocess.run(["umount", str(session.root / "cache")], check=True)
    asyncio.run(session.close())  # once the mount is gone, a second close finishes the job
    assert list(base.iterdir()) == []
    assert intact(victim)


def test_the_sweep_before_a_resume_detaches_mounts_a_killed_run_left(tmp_path: Path, victim: Path) -> None:
    base = tmp_path / "ws"
    left = base / "agentcompass-run9-t-0123456789abcdef" / "cache"
    left.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(victim), str(left)], check=True)
    assert asyncio.run(local_provider(base).sweep("run9")) == 1
    assert list(base.iterdir()) == []
    assert intact(victim)


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
