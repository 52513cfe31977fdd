"""A mount in a ``local`` workspace is detached, never emptied: the host data it shows stays."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_agentcompass.environments import mounts
from pytest_agentcompass.environments.local import LocalSession
from pytest_agentcompass.vocabulary.errors import SessionError

from local_workspaces import local_provider, open_session


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
        for point in mounts.mount_points(tmp_path):
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
    assert mounts.mount_points(base) == []


def test_a_mount_that_cannot_be_detached_is_named_and_nothing_is_removed(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No right to detach (``EPERM``): one clear error naming the mount point, the workspace and the data stay."""
    base = tmp_path / "ws"
    base.mkdir()
    monkeypatch.setattr(mounts, "_detach", lambda point: errno.EPERM)

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
