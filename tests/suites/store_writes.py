"""Who writes under a folder: every file opened for writing and every folder made there, with the
modules of the package whose code did it (an audit hook, so threads and ``os.open`` count too).

    with writes_under(run_root) as writes:
        pytester.runpytest(...)      # in this process
    assert not_through_the_store(writes) == []
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_agentcompass

PACKAGE = str(Path(pytest_agentcompass.__file__).parent) + os.sep
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


@dataclass(frozen=True)
class Write:
    path: str
    #: The package's modules on the stack, innermost first (``runtime/store/files.py``, ...).
    by: tuple[str, ...]


_watching: list[tuple[str, list[Write]]] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _watching:
        return
    if event == "open":
        path, mode, flags = args
        if not (
            (isinstance(flags, int) and flags & _WRITE_FLAGS) or (isinstance(mode, str) and set(mode) & set("wax+"))
        ):
            return
    elif event != "os.mkdir":
        return
    else:
        path = args[0]
    if not isinstance(path, str | os.PathLike):
        return  # a file descriptor
    full = os.path.abspath(os.fspath(path))
    for root, found in _watching:
        if full.startswith(root):
            by = []
            frame = sys._getframe(1)
            while frame is not None:
                name = frame.f_code.co_filename
                if name.startswith(PACKAGE):
                    by.append(name[len(PACKAGE) :])
                frame = frame.f_back  # type: ignore[assignment]
            found.append(Write(full[len(root) :], tuple(by)))


sys.addaudithook(_hook)  # once per process (an audit hook cannot be removed): it watches only inside the block


@contextlib.contextmanager
def writes_under(root: Path) -> Iterator[list[Write]]:
    found: list[Write] = []
    entry = (str(root.resolve()) + os.sep, found)
    _watching.append(entry)
    try:
        yield found
    finally:
        _watching.remove(entry)


def not_through_the_store(writes: list[Write]) -> list[Write]:
    """The writes whose innermost module of the package is not the store's (a lock file the store
    takes through ``concurrency/flock.py`` is the store's)."""
    store = "runtime" + os.sep + "store" + os.sep

    def by_store(write: Write) -> bool:
        by = write.by[:2] if write.by[:1] == ("concurrency" + os.sep + "flock.py",) else write.by[:1]
        return bool(by) and by[-1].startswith(store)

    return [w for w in writes if not by_store(w)]
