"""An exclusive ``flock`` on a lock file, held by one process at a time across the host.

The kernel drops the lock when its process dies, so a ``kill -9`` never
leaves a stale claim, and two processes cannot both win a race (a lock file
written in two steps, create then pid, could be read empty by a rival, taken
for stale and removed). Used for run directories (``runtime/store/runs.py``)
for image builds that take turns across processes (``environments/docker_images.py``) and for agent
installs and package fetches (``environments/docker_derived.py``, ``harnesses/agents/cache``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

__all__ = ["file_lock", "try_lock"]

#: Seconds between tries for a lock another process holds.
_LOCK_POLL = 0.2


def try_lock(path: Path) -> int | None:
    """A descriptor of ``path`` holding its exclusive ``flock``, or ``None`` while another process holds it.

    A holder may remove the file before it unlocks (so no lock file stays);
    whoever then gets the lock on the old file finds it is no longer
    ``path`` and opens again.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                current = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if current:
            return fd
        os.close(fd)  # the holder released (and removed) it between our open and flock


@contextlib.asynccontextmanager
async def file_lock(path: Path) -> AsyncIterator[None]:
    """The host-wide lock of ``path``, polled so no thread blocks on it; the file goes with the lock.

    Removed before it is unlocked: a process that opened the old file finds,
    once it holds the lock, that it is no longer ``path``, and opens again.
    """
    while (fd := try_lock(path)) is None:
        await asyncio.sleep(_LOCK_POLL)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)
