"""An exclusive ``flock`` on a lock file, held by one process at a time across the host.

The kernel drops the lock when its process dies, so a ``kill -9`` never
leaves a stale claim, and two processes cannot both win a race (a lock file
written in two steps, create then pid, could be read empty by a rival, taken
for stale and removed). Used for run directories (``runtime/store/runs.py``)
and for image builds that take turns across processes (``environments/docker_images.py``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["try_lock"]


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
