"""Emptied ``local`` workspaces kept for the next session: only while they are as the session made
them, and never once the provider closed."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from pytest_agentcompass import EnvironmentSpec, LocalEnvironment
from pytest_agentcompass.environments import markers, process, workspaces
from pytest_agentcompass.environments.workspaces import InlineRemoval
from pytest_agentcompass.vocabulary.errors import SessionError

from local_workspaces import local_provider, lock, open_session, unlock


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
            reapers = [p for p in markers.descendants(os.getpid()) if _is_exec_reaper(p)]
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
            b"_reaper.py" not in Path(f"/proc/{child}/cmdline").read_bytes() for child in markers.descendants(pid)
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
