"""Files in and out of a container through the engine's archive API only (blocking; run in a thread).

Nothing here runs a program inside the container: an agent may have
replaced its ``sh``, ``mv``, ``cat`` or ``rm``, but the engine's own
archive code (in the daemon, chrooted into the container's file system)
is out of its reach. Reading is streamed and bounded: a file larger than
what is left of the budget is never read, and a folder's archive is
abandoned once it would cost more than its cap or its time.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO, Any

from ..vocabulary.errors import SessionError

__all__ = [
    "Entry",
    "Save",
    "Skip",
    "Tree",
    "TreeCopy",
    "Watch",
    "blank_files",
    "copy_out",
    "dir_entry",
    "get_tree",
    "make_dirs",
    "put_tree",
    "read_entry",
    "read_head",
    "replace_tree",
    "replace_trees",
    "stat",
]

#: Bytes per read from the engine's archive stream.
_CHUNK = 1024 * 1024


def put_tree(container: Any, source: str | os.PathLike[str], target: str) -> None:
    """Copy the local folder ``source`` to the absolute ``target``, modes kept, owned by root."""
    destination = target.strip("/")
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        for parent in reversed(PurePosixPath(destination).parents[:-1]):
            archive.addfile(dir_entry(str(parent)))
        archive.add(os.fspath(source), arcname=destination, filter=_as_root)
    container.put_archive("/", payload.getvalue())


#: One folder to replace: its absolute path, the local folder it becomes (``None``: empty), its mode.
Tree = tuple[str, "str | os.PathLike[str] | None", int]


def replace_tree(container: Any, target: str, source: str | os.PathLike[str] | None = None, mode: int = 0o755) -> None:
    """Make ``target`` exactly the local folder ``source`` (or an empty folder of ``mode``)."""
    replace_trees(container, [(target, source, mode)])


def replace_trees(container: Any, trees: Iterable[Tree]) -> None:
    """Make each ``(target, source, mode)`` of ``trees`` exactly the local folder ``source`` (or
    an empty folder of ``mode``), all in one engine request (each archive call costs the engine
    tens of milliseconds, whatever it holds).

    One archive: each ``target`` first as an empty *file*, which makes the engine
    remove whatever is there (a folder with planted files, a symlink), then as
    a folder, then the folder's files. The engine does the removal itself:
    no ``rm`` of the container runs. Sent again (three times in all) when the
    engine's removal failed with "directory not empty": something wrote into
    a target while the engine emptied it (a process still running there).
    """
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        for target, source, mode in trees:
            name = target.strip("/")
            placeholder = tarfile.TarInfo(name)
            placeholder.mtime = int(time.time())
            archive.addfile(placeholder, io.BytesIO(b""))
            archive.addfile(dir_entry(name, mode))
            if source is not None:
                for entry in sorted(os.listdir(source)):
                    archive.add(os.path.join(source, entry), arcname=f"{name}/{entry}", filter=_as_root)
    for tries_left in reversed(range(_REPLACE_TRIES)):
        try:
            container.put_archive("/", payload.getvalue())
            return
        except Exception as exc:
            if not tries_left or "directory not empty" not in str(exc):
                raise
        time.sleep(0.05)  # a moment for the write that raced the removal to end


#: Times :func:`replace_trees` sends its archive when a write raced the engine's emptying of a target.
_REPLACE_TRIES = 3


def blank_files(container: Any, paths: Iterable[str]) -> None:
    """Make each absolute file of ``paths`` empty (mode 0644), in one archive: whatever was there goes."""
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        for path in paths:
            entry = tarfile.TarInfo(path.strip("/"))
            entry.mode, entry.mtime = 0o644, int(time.time())
            archive.addfile(entry, io.BytesIO(b""))
    container.put_archive("/", payload.getvalue())


def make_dirs(container: Any, paths: Iterable[str], mode: int = 0o777) -> None:
    """Create the absolute folders ``paths`` (``mode``; parents the engine makes are 0755), in one archive."""
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        for path in paths:
            archive.addfile(dir_entry(path.strip("/"), mode))
    container.put_archive("/", payload.getvalue())


def stat(container: Any, path: str) -> dict[str, Any] | None:
    """What the engine says of ``path`` (``name``, ``size``, ``mode``, ``mtime``, ``linkTarget``), or ``None``."""
    api = container.client.api
    response = api.head(api._url("/containers/{0}/archive", container.id), params={"path": path})
    if response.status_code == 404:
        return None
    _refused(response, path)
    header = response.headers.get("X-Docker-Container-Path-Stat")
    return json.loads(base64.b64decode(header)) if header else None


def read_head(container: Any, path: str, limit: int) -> tuple[bytes, int] | None:
    """The first ``limit`` bytes of the file at ``path`` and its whole size; ``None`` when there is no
    such regular file. Nothing past ``limit`` is read: a sparse or endless file costs ``limit`` at most."""
    found = read_entry(container, path, limit)
    return found if isinstance(found, tuple) else None


def read_entry(container: Any, path: str, limit: int) -> Entry | None:
    """:func:`read_head` in one engine request, saying what ``path`` is when it is no regular file:
    ``None`` when it does not exist, else ``"a link to <target>"``, ``"a folder"`` or ``"a special
    file"``. The archive's first entry says what the path is (no ``stat`` request first); the rest of
    a folder's archive is not read."""
    try:
        with _archive(container, path) as body, tarfile.open(fileobj=body, mode="r|") as archive:
            for member in archive:
                return _what(archive, member, limit)
    except _Absent:
        return None
    return "a special file"  # an empty archive: nothing the engine could pack


def get_tree(container: Any, source: str, limit: int) -> tuple[dict[str, bytes], bool]:
    """The regular files under ``source`` by relative name, at most ``limit`` bytes in all, and
    whether some were left out for the limit. A missing ``source`` gives no files."""
    files: dict[str, bytes] = {}

    def keep(name: str, handle: IO[bytes], size: int) -> int:
        files[name] = handle.read(size)
        return size

    report = copy_out(container, source, keep, limit)
    return files, bool(report.cut or report.stopped)


#: What an archive holds at a path: a regular file's first bytes and its size, else what it is.
Entry = tuple[bytes, int] | str


@dataclass
class TreeCopy:
    """What :func:`copy_out` copied of a folder and what it left, for the task's record."""

    files: int = 0
    bytes: int = 0
    #: Bytes that came through the engine's stream (copied or skipped over).
    read_bytes: int = 0
    limit_bytes: int = 0
    #: Files left out: ``{"name", "size", "why"}``.
    cut: list[dict[str, Any]] = field(default_factory=list)
    #: Why the copy ended before the folder's end ("" when it did not).
    stopped: str = ""
    #: What the archive held at each name :func:`copy_out` was asked to ``watch`` (``""``: the folder
    #: copied): ``(first bytes, size)`` of a regular file, else what it is (as :func:`read_entry` says);
    #: ``None``: a second name (hard link) of a file earlier in the archive, which a read of that path
    #: alone shows. A watched name absent here was not in the archive (nor is a socket ever: the
    #: engine leaves them out), or came after the copy stopped.
    watched: dict[str, Entry | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "bytes": self.bytes,
            "read_bytes": self.read_bytes,
            "limit_bytes": self.limit_bytes,
            "truncated": bool(self.cut or self.stopped),
            "cut": self.cut,
            **({"stopped": self.stopped} if self.stopped else {}),
        }


#: ``save(name, handle, size)``: store ``size`` bytes of a member read from ``handle``; returns bytes stored.
Save = Callable[[str, IO[bytes], int], int]
#: ``skip(name)``: whether to pass the file ``name`` over (an excluded pattern).
Skip = Callable[[str], bool]
#: ``(names, limit)``: entries of a copy to report whatever they are (:attr:`TreeCopy.watched`),
#: keeping the first ``limit`` bytes of each regular file.
Watch = tuple[Collection[str], int]


def copy_out(
    container: Any,
    source: str,
    save: Save,
    limit: int,
    time_limit: float | None = None,
    skip: Skip | None = None,
    watch: Watch | None = None,
) -> TreeCopy:
    """Stream the regular files under ``source`` to ``save``, at most ``limit`` bytes of them.

    A file larger than what is left of ``limit`` is listed as cut and skipped;
    skipping costs reading through it, so once the skipped bytes would pass
    ``limit`` too (a sparse or huge file), the archive is abandoned and the
    files after it are not seen. ``time_limit`` seconds bound the whole copy
    (a stalled engine included): the connection is shut when they run out.
    Links, devices and FIFOs are never followed or read; names ``skip`` says
    yes to are passed over. ``source`` may be one file: it is copied under its name.
    ``watch`` (names, and the ``limit`` of bytes to keep of each) asks what those
    entries are, whatever the copy does with them: :attr:`TreeCopy.watched`.
    """
    report = TreeCopy(limit_bytes=limit)
    deadline = None if time_limit is None else time.monotonic() + time_limit
    try:
        with _archive(container, source, deadline) as body:
            try:
                _copy_members(body, save, limit, report, skip, watch)
            except (tarfile.TarError, OSError) as exc:
                if not body.timer.expired:
                    report.stopped = f"the engine's archive ended early: {type(exc).__name__}: {exc}"
            report.read_bytes = body.count
            if body.timer.expired:
                report.stopped = f"stopped after {time_limit:g}s: the rest was not read"
    except _Absent:
        pass
    return report


def _copy_members(
    body: _Body, save: Save, limit: int, report: TreeCopy, skip: Skip | None, watch: Watch | None
) -> None:
    skip_room = limit
    with tarfile.open(fileobj=body, mode="r|") as archive:
        for member in archive:
            # Names relative to the folder (its own name dropped); a file copied alone keeps its name.
            folder, _, name = member.name.partition("/")
            name = name or (folder if member.isfile() else "")
            handle = None
            if watch is not None and name in watch[0]:
                handle = _watched(archive, member, name, watch[1], report)
            if not member.isfile() or not name or (skip is not None and skip(name)):
                continue
            if report.bytes + member.size > limit:
                report.cut.append({"name": name, "size": member.size, "why": "over the copy limit"})
                if member.size > skip_room:  # reading through it would cost more than the cap itself
                    report.stopped = f"stopped at {name} ({member.size} bytes): the rest was not read"
                    return
                skip_room -= member.size
                continue
            if handle is None:
                handle = archive.extractfile(member)
            if handle is not None:
                report.bytes += save(name, handle, member.size)
                report.files += 1
            if body.timer.expired:
                return


def _watched(
    archive: tarfile.TarFile, member: tarfile.TarInfo, name: str, limit: int, report: TreeCopy
) -> IO[bytes] | None:
    """Record what the watched entry ``name`` is in ``report``. For a regular file: its first ``limit``
    bytes, and a handle that reads the whole file again (that head, then the rest of the stream)."""
    if member.islnk():  # another name of a file earlier in the archive: only a read of it alone says more
        report.watched[name] = None
        return None
    stream = archive.extractfile(member) if member.isfile() else None
    if stream is None:
        report.watched[name] = _what(archive, member, limit)
        return None
    head = stream.read(min(limit, member.size))
    report.watched[name] = (head, member.size)
    return io.BufferedReader(_Joined(head, stream))  # whose read(n) gives n bytes, unless the file ends


class _Joined(io.RawIOBase):
    """``head``, already read from ``rest``, then what ``rest`` still holds."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _what(archive: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> Entry:
    """What the archive's ``member`` is: a regular file's first ``limit`` bytes and size, else its kind."""
    if member.issym() or member.islnk():
        return f"a link to {member.linkname}"
    handle = archive.extractfile(member) if member.isfile() else None
    if handle is None:
        return "a folder" if member.isdir() else "a special file"
    return handle.read(min(limit, member.size)), member.size


class _Absent(Exception):
    """The path does not exist in the container."""


class _Timer:
    """Shuts the archive's connection at ``deadline``, so a read blocked on it returns."""

    def __init__(self, shut: Callable[[], None], deadline: float | None) -> None:
        self.expired = False
        self._shut = shut
        self._timer: threading.Timer | None = None
        if deadline is not None:
            self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        self.expired = True
        self._shut()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _Body(io.RawIOBase):
    """The body of an archive response, read in chunks, counting what came through."""

    def __init__(self, response: Any, timer: _Timer) -> None:
        self._chunks = response.iter_content(_CHUNK, False)
        self._rest = b""
        self.count = 0
        self.timer = timer
        #: The whole body was read (the connection can go back to the pool).
        self.done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                self.done = True
                return 0
            self.count += len(self._rest)
        size = min(len(buffer), len(self._rest))
        buffer[:size] = self._rest[:size]
        self._rest = self._rest[size:]
        return size


@contextlib.contextmanager
def _archive(container: Any, path: str, deadline: float | None = None) -> Iterator[_Body]:
    """The engine's tar stream of ``path`` (the SDK's ``get_archive`` would lift every socket timeout)."""
    api = container.client.api
    response = api._get(api._url("/containers/{0}/archive", container.id), params={"path": path}, stream=True)

    def shut() -> None:
        with contextlib.suppress(Exception):
            sock = api._get_raw_response_socket(response)
            getattr(sock, "_sock", sock).shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            response.close()

    timer = _Timer(shut, deadline)
    body = _Body(response, timer)
    try:
        if response.status_code == 404:
            raise _Absent(path)
        _refused(response, path)
        yield body
    finally:
        timer.cancel()
        if body.done:
            response.close()
        else:
            shut()  # the unread rest of a huge archive is not drained


def _refused(response: Any, path: str) -> None:
    """Raise what the engine said when it refused ``path``: a :class:`SessionError`, never the HTTP
    client's own error. The engine refuses what the container holds (a link loop, a path made a file,
    a name too long): the agent can cause that, so it must not read as a flaky connection (``transport``,
    which the ``transient`` retry policy would re-roll)."""
    if response.status_code < 400:
        return
    try:
        said = str(response.json().get("message") or "").strip()
    except Exception:
        said = ""
    said = said or (response.text or "").strip()[:300] or response.reason or ""
    raise SessionError(f"the engine refused {path!r} (HTTP {response.status_code}): {said}")


def dir_entry(name: str, mode: int = 0o755) -> tarfile.TarInfo:
    """A folder entry of an archive written to a container (``name`` relative to ``/``)."""
    entry = tarfile.TarInfo(name)
    entry.type, entry.mode = tarfile.DIRTYPE, mode
    entry.mtime = int(time.time())
    return entry


def _as_root(entry: tarfile.TarInfo) -> tarfile.TarInfo:
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = "root"
    return entry
