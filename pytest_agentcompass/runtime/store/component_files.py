"""What components keep in a run directory, written by its store.

Each attempt's artifacts (the sink of ``vocabulary.artifacts``:
``artifacts/<task>/attempt-<i>[-retry-<r>]/<name>``) and the request's own
files (``RunFiles``: a provider's image build logs). Components never write
under a run directory themselves: everything goes through here, redacted,
into folders the store does not use for its own records.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any, Protocol

from ...vocabulary.artifacts import TextFile, check_artifact_name
from ...vocabulary.redact import Redactor
from ...vocabulary.types import to_jsonable

__all__ = ["ComponentFiles"]

#: Bytes per write when an artifact is streamed to its file.
_STREAM_CHUNK = 1024 * 1024
#: Characters of a text file held back for a line end, at most, before they are redacted and written.
_LINE_LIMIT = 64 * 1024


class _Store(Protocol):
    """What this module takes from ``files.RunStore`` (which builds it: no import back)."""

    run_dir: Path
    redactor: Redactor

    def _replacing(self, path: str | Path) -> AbstractContextManager[str]: ...

    def _folder_of(self, path: str | Path) -> str: ...

    def _bounded(
        self, record: Mapping[str, Any], encode: Callable[[Any], str] | None = None
    ) -> tuple[str, dict[str, int]]: ...


class ComponentFiles:
    """The files of one run directory that components write: the store's ``component_files``.

    A request's components get it as their ``run_files`` (the ``RunFiles``
    methods: :meth:`save`, :meth:`open_text`); the runtime's artifact sink
    calls :meth:`save_artifact` and :meth:`save_artifact_stream`.
    """

    def __init__(self, store: _Store, own_names: frozenset[str]) -> None:
        self._store = store
        #: The store's own files and folders at the run directory's top: not for components.
        self._own_names = own_names

    # -- an attempt's artifacts ----------------------------------------
    def save_artifact(self, task_id: str, attempt_index: int, retry_number: int, name: str, data: Any) -> str:
        """Write a harness artifact under ``artifacts/<task>/attempt-<i>[-retry-<r>]/<name>``, redacted.

        Text (and bytes that decode as UTF-8) is written exactly, with secrets
        masked; other bytes as they are; any other value as indented JSON.
        Returns the path relative to the run directory.
        """
        relative = _artifact_path(task_id, attempt_index, retry_number, name)
        self._write(relative, self._encoded(data))
        return relative

    def save_artifact_stream(
        self, task_id: str, attempt_index: int, retry_number: int, name: str, handle: IO[bytes], limit: int
    ) -> tuple[str, int]:
        """Like :meth:`save_artifact` for ``handle``'s content, of which at most ``limit`` bytes are
        read: chunk by chunk straight to the file, or, when the run has secrets to mask, held (up to
        ``limit``) to be redacted whole. Returns the relative path and the bytes stored."""
        store = self._store
        relative = _artifact_path(task_id, attempt_index, retry_number, name)
        written = 0
        with store._replacing(f"{store.run_dir}/{relative}") as tmp, open(tmp, "wb") as fh:
            if store.redactor:
                data = handle.read(limit)
                try:
                    data = store.redactor.text(data.decode("utf-8")).encode("utf-8")
                except UnicodeDecodeError:
                    pass  # binary: stored as it is
                fh.write(data)
                written = len(data)
            else:
                while written < limit and (chunk := handle.read(min(_STREAM_CHUNK, limit - written))):
                    fh.write(chunk)
                    written += len(chunk)
        return relative, written

    # -- the request's own files (RunFiles) ----------------------------
    def save(self, name: str, data: bytes | str | Any) -> str:
        """Write ``data`` as ``name`` (a file of the request), encoded and redacted like an artifact."""
        relative = self._own(name)
        self._write(relative, self._encoded(data))
        return relative

    @contextlib.contextmanager
    def open_text(self, name: str) -> Iterator[TextFile]:
        """``name`` opened for writing text piece by piece, each line redacted as it is written."""
        store = self._store
        path = store.run_dir / self._own(name)
        store._folder_of(path)
        with open(path, "w", encoding="utf-8") as fh:
            text = _RedactedText(fh, store.redactor, path)
            try:
                yield text
            finally:
                text.end()

    # -- plumbing ------------------------------------------------------
    def _own(self, name: str) -> str:
        """``name`` checked: safe parts, and not among the store's own files."""
        check_artifact_name(name)
        if name.split("/")[0] in self._own_names:
            raise ValueError(f"{name!r} is among the run directory's own files ({name.split('/')[0]}); choose a folder")
        return name

    def _encoded(self, data: Any) -> bytes:
        """Text (and bytes that decode as UTF-8) redacted; other bytes as they are; a mapping as
        indented JSON, its fields bounded like a detail's; any other value as indented JSON."""
        store = self._store
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError:
                return bytes(data)
        if isinstance(data, str):
            return (store.redactor.text(data) if store.redactor else data).encode("utf-8")
        if isinstance(data, Mapping):  # a JSON record (a trajectory)
            return store._bounded(data, self._people_json)[0].encode("utf-8")
        return self._people_json(data).encode("utf-8")

    def _people_json(self, data: Any) -> str:
        store = self._store
        value = store.redactor.apply(data) if store.redactor else data
        return json.dumps(value, indent=1, default=to_jsonable)  # read by people

    def _write(self, relative: str, data: bytes) -> None:
        store = self._store
        with store._replacing(f"{store.run_dir}/{relative}") as tmp, open(tmp, "wb") as fh:
            fh.write(data)


def _artifact_path(task_id: str, attempt_index: int, retry_number: int, name: str) -> str:
    folder = f"attempt-{attempt_index}" + (f"-retry-{retry_number}" if retry_number else "")
    return f"artifacts/{task_id}/{folder}/{name}"


class _RedactedText:
    """A :class:`~pytest_agentcompass.vocabulary.artifacts.TextFile`: whole lines are redacted
    and written at once; the rest waits for its line end (at most ``_LINE_LIMIT`` characters)."""

    def __init__(self, fh: IO[str], redactor: Redactor | None, path: Path) -> None:
        self._fh, self._redactor, self.path = fh, redactor, path
        self._pending = ""

    def write(self, text: str) -> None:
        if not self._redactor:
            self._fh.write(text)
        else:
            head, end, self._pending = (self._pending + text).rpartition("\n")
            if end:
                self._fh.write(self._redactor.text(head + end))
            if len(self._pending) > _LINE_LIMIT:
                self._fh.write(self._redactor.text(self._pending))
                self._pending = ""
        self._fh.flush()  # a log is read while it grows (a long build)

    def end(self) -> None:
        if self._pending:
            self._fh.write(self._redactor.text(self._pending) if self._redactor else self._pending)
            self._pending = ""
