"""How ``local`` workspace directories are made and removed, ten thousand times per run.

A workspace is made on first use and removed when its session closes. On a
quick file system that is tens of microseconds; on a busy ext4 a ``mkdir``
and an ``rmdir`` cost hundreds of microseconds of CPU and milliseconds of
waiting, more than the rest of a task. Three measures keep that off the
task's path (figures in docs/performance.md):

- :class:`Spares`: an emptied workspace is kept, empty, and *renamed* into
  the next one: a rename is a fraction of a ``mkdir`` plus an ``rmdir``;
- :class:`InlineRemoval`: a small flat workspace is emptied right on the
  event loop while that stays quick, by a few long-lived threads otherwise;
- :func:`remove_workspace`: a listing and a few ``unlink``s when small and
  flat, ``rmtree`` otherwise, and a failure names what stays.

A removal never reaches through a mount point: a command running as root
may mount anything in its workspace (``mount --bind /data cache``), and
``rmtree`` would delete the files the mount shows, which are not ours. The
walk detaches such mounts first (``mounts.py``), or removes nothing and says
which one stays.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import stat
import threading
from pathlib import Path

from ..concurrency.threads import BlockingCallPool, shared_pool
from ..vocabulary.errors import SessionError
from .mounts import detach_mounts

__all__ = [
    "FLAT_REMOVAL_ENTRIES",
    "INLINE_REMOVAL_BYTES",
    "Identity",
    "InlineRemoval",
    "Spares",
    "identity",
    "inline_removal",
    "remove_flat",
    "remove_spares",
    "remove_workspace",
    "removal_pool",
]

#: ``(device, inode)`` of a directory.
Identity = tuple[int, int]

#: How a workspace is opened to be listed, checked or emptied: never through a link in its place.
_LISTING = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def identity(path: Path | str) -> Identity | None:
    """``(device, inode)`` of ``path`` itself when it is a directory (not a symlink to one), else ``None``."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None


class Spares:
    """Emptied workspaces of one provider, kept to become the next ones.

    A directory is kept only while it is still the one its session made
    (same inode, not a link), private (mode 0700, ours), and once every
    reaper of its session's commands said they are done. :meth:`take`
    renames a spare to the new name and checks all of it again there, empty
    and without extended attributes (a default ACL is one) included: a
    process that never descended from the task's commands (a shell a user's
    tmux server started for it) could still have its working directory in
    it. A spare that changed is renamed out of the way, never handed out,
    and removed with the rest by :meth:`close`'s caller, off the event loop.
    A spare keeps its last name, which carries the run id, so the sweep
    before a resume finds it if the process dies.

    Spares are kept between a session's open and the provider's ``aclose``
    (at the end of the run; after each task where a task runs alone):
    :meth:`close` stops keeping them until :meth:`reopen`. Offered from the
    event loop or a removal thread, hence the lock.
    """

    #: Kept at most: as many as close between two opens, a handful in a steady run.
    LIMIT = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Each with the identity its session made it with, which :meth:`take` checks after the rename.
        self._dirs: list[tuple[str, Identity]] = []
        self._open = True
        #: Spares that changed or could not be renamed, for :meth:`close`'s caller to remove.
        self._stale: list[str] = []

    def __len__(self) -> int:
        return len(self._dirs) + len(self._stale)

    def reopen(self) -> None:
        """A session opens: keep emptied workspaces again (after an ``aclose``, the provider is in use again)."""
        self._open = True

    def offer(self, path: str, info: os.stat_result, made: Identity | None) -> bool:
        """Keep ``path`` (just emptied; ``info`` is its ``fstat``) if it is still the private directory ``made``.

        ``False``: the caller removes it. The rest is checked by :meth:`take`,
        which has to check it anyway: no system call here.
        """
        if made is None or not self._open or not _private(info, made):
            return False
        with self._lock:
            if not self._open or len(self._dirs) >= self.LIMIT:
                return False
            self._dirs.append((path, made))
        return True

    def take(self, target: Path) -> bool:
        """Rename a spare to ``target`` and check it is as it was kept; ``False`` when none is (then make it).

        Nothing is removed here, on the event loop: what is not handed out is
        moved to a name of its own (or left where it is) for :meth:`close`'s
        caller, so ``target`` is free again whenever this returns ``False``.
        """
        while True:
            with self._lock:
                if not self._dirs:
                    return False
                spare, made = self._dirs.pop()
            try:
                os.rename(spare, target)
            except OSError:
                self._set_aside(spare)  # gone (a sweep) or in the way: try the next one
                continue
            if _fresh(target, made):
                return True
            # Changed while it was kept: never handed out. The suffix keeps the
            # run id in the name, for the sweep.
            aside = f"{target}.stale-{secrets.token_hex(4)}"
            try:
                os.rename(target, aside)
            except OSError as exc:
                raise SessionError(f"workspace {target} changed while kept and cannot be moved aside: {exc}") from None
            self._set_aside(aside)

    def close(self) -> list[str]:
        """Keep no more spares until :meth:`reopen`; what is kept, for :func:`remove_spares`."""
        with self._lock:
            self._open = False
            left = [path for path, _ in self._dirs] + self._stale
            self._dirs, self._stale = [], []
        return left

    def _set_aside(self, path: str) -> None:
        if os.path.lexists(path):
            with self._lock:
                self._stale.append(path)


def remove_spares(paths: list[str]) -> None:
    """Remove what :meth:`Spares.close` returned (in a removal thread).

    :raises SessionError: naming the first one that stays.
    """
    failures: list[SessionError] = []
    for path in paths:
        try:
            remove_workspace(Path(path))
        except SessionError as exc:
            failures.append(exc)
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise SessionError(f"{failures[0]}{more}")


def _private(info: os.stat_result, made: Identity) -> bool:
    return (
        stat.S_ISDIR(info.st_mode)
        and (info.st_dev, info.st_ino) == made
        and stat.S_IMODE(info.st_mode) == 0o700
        and info.st_uid == os.geteuid()
    )


def _xattrs(folder: int) -> bool:
    """Whether the directory carries extended attributes of its own (``security.*`` labels every file)."""
    try:
        return any(not name.startswith("security.") for name in os.listxattr(folder))
    except OSError:
        return False  # a file system without them


def _fresh(path: Path, made: Identity) -> bool:
    """``path`` is the directory ``made``, private, empty and without extended attributes."""
    try:
        folder = os.open(path, _LISTING)
    except OSError:
        return False
    try:
        with os.scandir(folder) as listing:
            empty = next(listing, None) is None
        return empty and _private(os.fstat(folder), made) and not _xattrs(folder)
    except OSError:
        return False
    finally:
        os.close(folder)


#: Threads that remove workspaces, shared by every session of the process. Few
#: and long-lived: a burst of closing tasks queues here instead of starting a
#: thread each (a 1,000-task run used to start hundreds), and a slow disk makes
#: these threads wait, not the event loop (an ``rmdir`` took 1-3 ms on a busy ext4).
REMOVAL_THREADS = 8
_removals: BlockingCallPool | None = None


def removal_pool() -> BlockingCallPool:
    # Shared: a run's loop waits for its removals at the end, also for tasks cancelled meanwhile.
    global _removals
    if _removals is None:
        _removals = shared_pool(REMOVAL_THREADS, "agentcompass-rm")
    return _removals


class InlineRemoval:
    """Whether a small workspace is removed right on the event loop or by a removal thread.

    Removing one file and a directory takes tens of microseconds on a quick
    file system, and handing that to a thread and back cost far more CPU:
    threads taking the GIL from a busy loop in turns. Measured with 10,000
    tasks writing one file, 500 at a time, against tasks writing nothing:
    1.9x the CPU in threads against 1.15-1.2x inline on tmpfs, and on a busy
    ext4 1.7-1.8x in threads against 1.3-1.5x inline (docs/performance.md).
    Only when one removal holds the loop for milliseconds do threads pay for
    themselves, by letting those waits overlap. So removals run inline while
    their running mean stays under :attr:`LIMIT`, go to threads beyond it,
    and every :attr:`PROBE`-th removal tries inline again, to notice the
    disk calming down.
    """

    LIMIT = 0.002
    PROBE = 64

    def __init__(self) -> None:
        self.mean = 0.0
        self.skipped = 0

    def wanted(self) -> bool:
        if self.mean <= self.LIMIT:
            return True
        self.skipped += 1
        if self.skipped >= self.PROBE:
            self.skipped = 0
            return True
        return False

    def took(self, seconds: float) -> None:
        self.mean = 0.8 * self.mean + 0.2 * seconds


#: Process-wide, like the file systems it measures (only ever used on event-loop threads).
inline_removal = InlineRemoval()


#: Up to this many entries, none a directory, a workspace is removed with a
#: plain listing and ``unlink``s: fewer system calls than ``rmtree``'s walk.
FLAT_REMOVAL_ENTRIES = 16

#: A file larger than this is not removed on the event loop: freeing its blocks can take a while.
INLINE_REMOVAL_BYTES = 8 << 20


def remove_workspace(root: Path, spares: Spares | None = None, made: Identity | None = None) -> None:
    """Remove ``root`` and everything in it (or empty it into ``spares``: see :meth:`Spares.offer`).

    :raises SessionError: naming what stays.
    """
    if not remove_flat(str(root), spares=spares, made=made):
        _remove_tree(root)


def remove_flat(
    root: str, max_bytes: int | None = None, spares: Spares | None = None, made: Identity | None = None
) -> bool:
    """Remove ``root`` (or empty it into ``spares``) if it is small and flat.

    ``False`` leaves it, or what is left of it, to :func:`_remove_tree`: also
    when it is not ``made`` (or ``made`` is unknown), since only the walk
    checks for mount points. A flat directory holds none but maybe itself:
    ``unlink`` never reaches through a file mounted on an entry (it fails).

    :param max_bytes: leave it also when a file is larger than this.
    :param spares: where the emptied directory goes instead of ``rmdir`` when it is still ``made``.
    """
    try:
        # Not followed if a command put a link in its place: the files it leads to are not ours.
        folder = os.open(root, _LISTING)
    except FileNotFoundError:
        return not os.path.lexists(root)
    except OSError:
        return False  # a link or a file: _remove_tree removes that, not what it leads to
    try:
        info = os.fstat(folder)
        if made is None or (info.st_dev, info.st_ino) != made:
            # Not known to be the directory its session made: maybe one mounted
            # in its place (a bind mount of the same file system keeps st_dev),
            # whose files are not ours. The walk looks for mount points first.
            return False
        with os.scandir(folder) as listing:
            entries = list(itertools.islice(listing, FLAT_REMOVAL_ENTRIES + 1))
        if len(entries) > FLAT_REMOVAL_ENTRIES or any(entry.is_dir(follow_symlinks=False) for entry in entries):
            return False
        if max_bytes is not None and any(e.stat(follow_symlinks=False).st_size > max_bytes for e in entries):
            return False
        for entry in entries:
            os.unlink(entry.name, dir_fd=folder)
        if spares is None or not spares.offer(root, info, made):
            os.rmdir(root)
    except FileNotFoundError:
        return not os.path.lexists(root)
    except OSError:
        return False  # _remove_tree tries again and says what stays
    finally:
        os.close(folder)
    return True


def _remove_tree(root: Path) -> None:
    """``rmtree`` that reports what it could not remove (a vanished path is not a failure).

    :raises SessionError: naming the first path left behind and how many there are.
    """
    try:
        kind = os.lstat(root).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SessionError(f"workspace {root} was not removed: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(kind):
        # A command put a link (or a file, a FIFO) in its place: that goes,
        # not what a link leads to; and rmtree would open a FIFO and wait.
        try:
            os.unlink(root)
        except OSError as exc:
            raise SessionError(f"workspace {root} was not removed: {exc.strerror or exc}") from None
        return
    detach_mounts(root)
    failures: list[tuple[str, BaseException]] = []

    def failed(_function: object, path: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            failures.append((path, exc_info[1]))

    shutil.rmtree(root, onerror=failed)
    if failures:
        path, error = failures[0]
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise SessionError(f"workspace {root} was not removed: {path}: {reason}{more}")
