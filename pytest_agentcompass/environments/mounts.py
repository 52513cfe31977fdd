"""Mount points under a folder, and detaching them: a removal never reaches through a mount.

A command running as root may mount anything in its workspace (``mount
--bind /data cache``); ``rmtree`` would then delete the files the mount
shows, which are not ours. :func:`detach_mounts` detaches every mount under
a folder first (lazily: whoever uses it keeps it), or says which one stays.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

from ..vocabulary.errors import SessionError

__all__ = ["detach_mounts", "mount_points"]

#: Rounds of detaching before a mount that keeps coming back (a process still mounting) is reported.
_DETACH_ROUNDS = 8
#: ``umount2`` flags: detach lazily (whoever uses the mount keeps it), and not through a link in its place.
_MNT_DETACH = 2
_UMOUNT_NOFOLLOW = 8
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")
_umount2: Any = None


def detach_mounts(root: Path) -> None:
    """Detach every mount at or under ``root``, deepest first, before the walk removes anything.

    Only here, on the walk's path: a flat workspace that is still the
    directory its session made holds no mount point (see ``workspaces.remove_flat``).

    :raises SessionError: naming a mount point that stays; then nothing is removed.
    """
    refused: dict[bytes, int] = {}
    for _ in range(_DETACH_ROUNDS):
        mounts = mount_points(root)
        if not mounts:
            return
        if refused.keys() >= set(mounts):
            break  # every one left refused already: trying again changes nothing
        refused = {point: code for point in mounts if (code := _detach(point))}
    else:
        mounts = mount_points(root)  # a process still mounting: what it left now
        if not mounts:
            return
    point = next((point for point in mounts if point in refused), mounts[0])
    reason = os.strerror(refused[point]) if point in refused else "mounted again after each detach"
    raise SessionError(
        f"workspace {root} holds a mount point that cannot be detached: {os.fsdecode(point)} ({reason}): not removed"
    )


def mount_points(root: Path) -> list[bytes]:
    """Mount points at or under ``root`` in this process's mount namespace, deepest first.

    From ``/proc/self/mountinfo``: a bind mount of the same file system
    keeps ``st_dev``, so a walk comparing devices would not see it. Empty
    where there is no such file (not Linux): nothing else lists them.
    """
    try:
        with open("/proc/self/mountinfo", "rb") as info:
            lines = info.read().splitlines()
    except OSError:
        return []
    top = os.fsencode(root)
    found = []
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 5:
            continue
        # The fifth field is the mount point, with space, tab, newline and backslash octal-escaped.
        point = _OCTAL_ESCAPE.sub(lambda match: bytes([int(match[1], 8)]), fields[4])
        if point == top or point.startswith(top + b"/"):
            found.append(point)
    return sorted(set(found), key=lambda point: point.count(b"/"), reverse=True)


def _detach(point: bytes) -> int:
    """``umount2(point, MNT_DETACH)``: 0, or the ``errno`` (``EPERM`` without the right to)."""
    # Imported here: it takes milliseconds, and only a workspace that holds a mount needs it.
    import ctypes

    global _umount2
    if _umount2 is None:
        try:
            _umount2 = ctypes.CDLL(None, use_errno=True).umount2
        except (OSError, AttributeError):
            return errno.ENOSYS  # not Linux
    if _umount2(point, _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0:
        return 0
    return ctypes.get_errno() or errno.EPERM
