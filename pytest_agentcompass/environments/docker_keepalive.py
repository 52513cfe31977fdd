"""The program that keeps a ``docker`` container up: the runner's own, never the image's.

A container needs a first command that runs until the runner ends it. Taking
it from the image (``/bin/sleep``) fails on an image without one (distroless,
``FROM scratch`` with a single static binary), and in a container started from
a snapshot of the agent's it would run whatever the agent left at that path,
as a process the runner counts as its own. So the runner writes its own
program into each container it creates, before the container starts, through
the engine's archive API, at a path with a random name (nothing the agent
planted can be there), and starts that.

The program is a static ELF executable of a few instructions, built here
byte by byte (nothing binary is committed; :func:`program` is the whole of
it): wait for a signal, forever. It has no handlers, so a SIGTERM or SIGKILL
(forwarded by the container's init, its parent) ends it with the default
action, as it did ``sleep``.
"""

from __future__ import annotations

import io
import struct
import tarfile
import time
from collections.abc import Sequence
from typing import Any

from .docker_files import dir_entry

__all__ = ["KEEPALIVE_PREFIX", "arch_of", "install", "program"]

#: Where the keepalive goes (a random suffix per container): the root always exists and is a folder.
KEEPALIVE_PREFIX = "/.agentcompass-keepalive-"

#: The machine code of each architecture, which loops on a syscall that sleeps until a signal.
_CODE = {
    # x86_64: loop: mov eax, 34 (pause); syscall; jmp loop
    "amd64": bytes.fromhex("b8220000000f05ebf7"),
    # aarch64 has no pause(): ppoll(NULL, 0, NULL, NULL, 0) is how its libcs spell it.
    # loop: mov x0..x4, #0; mov x8, #73 (ppoll); svc #0; b loop
    "arm64": b"".join(
        struct.pack("<I", word)
        for word in (0xD2800000, 0xD2800001, 0xD2800002, 0xD2800003, 0xD2800004, 0xD2800928, 0xD4000001, 0x17FFFFF9)
    ),
}
#: ELF ``e_machine`` of each.
_MACHINE = {"amd64": 62, "arm64": 183}
#: The names engines report for them (``docker version``'s ``Arch``; ``uname -m``).
_ALIASES = {"amd64": "amd64", "x86_64": "amd64", "arm64": "arm64", "aarch64": "arm64"}
#: Where the one segment (headers and code) is loaded: page-aligned for 4 KiB to 64 KiB pages.
_BASE = 0x400000
_EHSIZE, _PHSIZE = 64, 56


def arch_of(client: Any) -> str | None:
    """The engine's own architecture, if it is one :func:`program` has code for (blocking).

    The engine's, not the image's: a host runs its own code natively even in a
    container of an emulated image.
    """
    version = client.version() or {}
    if str(version.get("Os") or "linux") != "linux":  # Windows containers run no ELF
        return None
    return _ALIASES.get(str(version.get("Arch") or ""))


def program(arch: str) -> bytes:
    """The keepalive as a static ELF64 executable for ``arch`` (``amd64`` or ``arm64``)."""
    code = _CODE[arch]
    entry = _BASE + _EHSIZE + _PHSIZE
    size = _EHSIZE + _PHSIZE + len(code)
    header = struct.pack(
        "<4sBBBBB7xHHIQQQIHHHHHH",
        b"\x7fELF",
        2,  # ELFCLASS64
        1,  # little endian
        1,  # EV_CURRENT
        0,  # System V ABI
        0,
        2,  # ET_EXEC: fixed addresses, no loader
        _MACHINE[arch],
        1,
        entry,
        _EHSIZE,  # program headers right after this one
        0,  # no section headers
        0,
        _EHSIZE,
        _PHSIZE,
        1,
        0,
        0,
        0,
    )
    segment = struct.pack(
        "<IIQQQQQQ",
        1,  # PT_LOAD
        5,  # readable and executable, not writable
        0,
        _BASE,
        _BASE,
        size,
        size,
        0x10000,
    )
    return header + segment + code


def install(api: Any, container_id: str, keepalive: tuple[str, bytes] | None, dirs: Sequence[str] = ()) -> None:
    """Write the program ``keepalive`` (its path, its bytes) and the absolute folders ``dirs`` (mode
    0777: whoever runs there writes to them) into the created, not yet started container, in one
    engine request (blocking; each archive call costs the engine tens of milliseconds)."""
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        if keepalive is not None:
            path, data = keepalive
            entry = tarfile.TarInfo(path.lstrip("/"))
            entry.size, entry.mode, entry.mtime = len(data), 0o555, int(time.time())
            archive.addfile(entry, io.BytesIO(data))
        for folder in dirs:
            archive.addfile(dir_entry(folder.strip("/"), 0o777))
    api.put_archive(container_id, "/", payload.getvalue())
