"""Finding Harbor task directories under a folder, their ids, and a digest of their files."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...vocabulary.artifacts import safe_slug
from .taskdir import INSTRUCTION_FILE, TASK_FILE

__all__ = ["files_digest", "find_task_dirs", "task_id_for"]


def find_task_dirs(root: Path, hidden: list[Path] | None = None) -> Iterator[Path]:
    """Task directories under ``root`` (``root`` itself if it is one), sorted, nested folders allowed.

    Hidden folders (``.git``, ``.cache``, ``..dots``) are not searched: a repository of tasks keeps
    its tooling there. One that holds a ``task.toml`` itself is added to ``hidden``, so the caller
    can say it was skipped rather than lose a task without a word."""
    if (root / TASK_FILE).is_file():
        yield root
        return
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        if not child.name.startswith("."):
            yield from find_task_dirs(child, hidden)
        elif hidden is not None and (child / TASK_FILE).is_file():
            hidden.append(child)


_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def task_id_for(name: str) -> str:
    """The task id of a directory named ``name``: the name itself when it is a safe id (letters,
    digits, ``.``, ``_``, ``-``); else its letters without accents, other characters as ``-``, and a
    short digest of the real name, so the id is stable and two names never share one
    (``my task`` -> ``my-task-<8 hex>``, ``café`` -> ``cafe-<8 hex>``)."""
    return name if _SAFE_ID.match(name) else safe_slug(name, "-")


def files_digest(path: Path) -> str:
    """A digest of every file of the task: part of its fingerprint, so a carried-over or resumed
    result never outlives an edit of the task, however deep in its folders.

    ``task.toml``, ``instruction.md``, ``tests/`` and ``solution/`` are small
    and decide the verdict: their content counts. ``environment/`` can hold a
    whole repository, so its files count by name, size, mode and modification
    time (``stat`` only, at every depth; the image tag hashes the content when
    the image is built), which keeps loading 1,000 tasks well under a second.
    """
    digest = hashlib.sha256()
    for name in (TASK_FILE, INSTRUCTION_FILE):
        _add_file(digest, path, path / name, content=True)
    for folder, content in (("tests", True), ("solution", True), ("environment", False)):
        if (path / folder).is_symlink():  # never walked: a link to / would be the whole disk
            _add_file(digest, path, path / folder, content=False)
            continue
        for root, dirs, files in os.walk(path / folder):
            dirs.sort()
            for name in sorted(files):
                _add_file(digest, path, Path(root, name), content=content)
    return digest.hexdigest()[:16]


def _add_file(digest: Any, task: Path, file: Path, *, content: bool) -> None:
    try:
        info = file.lstat()
    except OSError:
        return
    rel = file.relative_to(task).as_posix()
    digest.update(f"{rel}\0{info.st_size}\0{info.st_mode:o}\0".encode())
    if stat.S_ISLNK(info.st_mode):
        digest.update(os.readlink(file).encode(errors="surrogateescape"))
    elif content:
        try:
            digest.update(file.read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
    else:
        digest.update(str(info.st_mtime_ns).encode())
    digest.update(b"\n")
