"""Whole folders in and out of a container, one tar archive each way (blocking; run in a thread)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import PurePosixPath
from typing import Any

__all__ = ["get_tree", "put_tree"]


def put_tree(container: Any, source: str | os.PathLike[str], target: str) -> None:
    """Copy the local folder ``source`` to the absolute ``target``, modes kept, owned by root."""
    destination = target.strip("/")
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        for parent in reversed(PurePosixPath(destination).parents[:-1]):
            archive.addfile(_dir_entry(str(parent)))
        archive.add(os.fspath(source), arcname=destination, filter=_as_root)
    container.put_archive("/", payload.getvalue())


def get_tree(container: Any, source: str, limit: int) -> tuple[dict[str, bytes], bool]:
    """The regular files under ``source`` by relative name, at most ``limit`` bytes in all, and
    whether some were left out for the limit. A missing ``source`` gives no files."""
    import docker

    try:
        stream, _ = container.get_archive(source)
    except docker.errors.NotFound:
        return {}, False
    files: dict[str, bytes] = {}
    total, cut = 0, False
    with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as archive:  # streamed, never joined
        for member in archive:
            name = member.name.partition("/")[2]  # drop the folder's own name
            if not member.isfile() or not name:
                continue
            if total + member.size > limit:
                cut = True
                continue  # a smaller file further on may still fit (the reward, say)
            handle = archive.extractfile(member)
            files[name] = handle.read() if handle else b""
            total += member.size
    return files, cut


def _dir_entry(name: str) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type, entry.mode = tarfile.DIRTYPE, 0o755
    return entry


def _as_root(entry: tarfile.TarInfo) -> tarfile.TarInfo:
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = "root"
    return entry


class _ChunkReader(io.RawIOBase):
    """A file over the SDK's chunk iterator."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = iter(chunks)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._rest))
        buffer[:size] = self._rest[:size]
        self._rest = self._rest[size:]
        return size
