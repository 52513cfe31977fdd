"""Writing a run directory's files: whole, through a temporary name and a rename, or in place.

The plumbing under :class:`~.files.RunStore` and :class:`~.details.DetailFiles` (which decide what goes where):
plain ``os`` calls on ``str`` paths, each folder made once.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ...vocabulary.types import to_jsonable

__all__ = ["FileWriter", "fallback", "read_json", "readable"]


def fallback(value: Any) -> Any:
    # Only called by the C encoder for types JSON does not know.
    return to_jsonable(value)


def readable(value: Any, depth: int = 2, indent: str = "") -> str:
    """One entry per line for the first ``depth`` levels, compact below.

    Keeps ``run_info.json`` readable without the pure-Python indenting
    encoder, which costs seconds once ten thousand plans are recorded.
    """
    if depth == 0 or not isinstance(value, dict) or not value:
        return json.dumps(value, separators=(",", ": "), default=fallback)
    inner = indent + "  "
    items = [f"{inner}{json.dumps(str(k))}: {readable(v, depth - 1, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, "rb") as fh:  # bytes: json decodes UTF-8 itself, without a text layer
        return json.loads(fh.read())


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def _write_all(fd: int, text: str) -> None:
    """``text`` and a newline, as UTF-8, to ``fd``: every byte, however many writes it takes."""
    view = memoryview((text + "\n").encode("utf-8"))
    while view:
        view = view[os.write(fd, view) :]


class FileWriter:
    """Writes files whole (temporary name, then rename) or in place; remembers the folders it made."""

    def __init__(self) -> None:
        self._made: set[str] = set()
        # Unique temporary names without a random draw per file: a kill can
        # leave one behind, and two processes (xdist workers) share the folder.
        self._tmp_tag = f"{os.getpid()}-{secrets.token_hex(3)}-"
        self._serial = 0

    def _folder_of(self, path: str | Path) -> str:
        """The folder of ``path``, made on its first file (remembered: no ``makedirs`` per file)."""
        folder = os.path.dirname(path)
        if folder not in self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        return folder

    @contextlib.contextmanager
    def _replacing(self, path: str | Path) -> Iterator[str]:
        """A temporary name that becomes ``path`` if the block succeeds and is removed if it fails."""
        folder = self._folder_of(path)
        self._serial += 1
        tmp = f"{folder}/.{os.path.basename(path)}.{self._tmp_tag}{self._serial}.tmp"
        try:
            yield tmp
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _write_chunks(self, path: Path, chunks: Iterable[str]) -> None:
        """Like :meth:`_write_text` for a file too large to hold as one string."""
        with self._replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(chunks)
            fh.write("\n")

    def _write_text(self, path: str | Path, text: str) -> None:
        """Write ``text`` to ``path`` through a temporary name and a rename.

        Synchronous on purpose: creating a small file costs tens of
        microseconds, while a writer thread paid for every system call with
        a wait for the GIL of a busy event loop (measured in
        docs/performance.md). Plain ``os`` calls on ``str`` paths: pathlib's
        parsing was a visible share of a no-op task.
        """
        with self._replacing(path) as tmp:
            fd = os.open(tmp, _CREATE, 0o644)
            try:
                _write_all(fd, text)
            finally:
                os.close(fd)

    def _write_in_place(self, path: str, text: str) -> None:
        """Write ``text`` to ``path`` itself, no temporary name: for detail records.

        A rename is two more changes to the folder, and under xdist two
        workers create their details in one folder at once, where each change
        waits for the folder's lock: on ext4, 10,000 details through a
        temporary name cost seconds of kernel CPU more than in place. A record
        cut short by a kill is not JSON (its closing brace comes last), and
        every reader takes a detail that does not parse for a task not done.
        """
        self._folder_of(path)
        fd = os.open(path, _CREATE, 0o644)
        try:
            _write_all(fd, text)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)  # half a record: gone, so the task reads as not done
            raise
        finally:
            os.close(fd)
