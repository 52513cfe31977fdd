"""The program that keeps a ``docker`` container up: the runner's own, never the image's.

A container needs a first command that runs until the runner ends it. Taking
it from the image (``/bin/sleep``) fails on an image without one (distroless,
``FROM scratch`` with a single static binary), and in a container started from
a snapshot of the agent's it would run whatever the agent left at that path,
as a process the runner counts as its own. So every container runs the
runner's own program, from a folder with a random name (nothing the agent
planted can be there).

That folder is a volume, mounted read-only: one per engine, written once
(:class:`KeepaliveVolumes`), so a container costs no engine request for it.
An engine that cannot make one gets the program written into each container
instead, before it starts, through the engine's archive API (a request of
about 50 ms per container).

The program is a static ELF executable of a few instructions, built here
byte by byte (nothing binary is committed; :func:`program` is the whole of
it): wait for a signal, forever. It has no handlers, so a SIGTERM or SIGKILL
(forwarded by the container's init, its parent) ends it with the default
action, as it did ``sleep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import posixpath
import secrets
import struct
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .docker_files import dir_entry
from .markers import PROCESS_LABEL, run_filter

__all__ = [
    "KEEPALIVE_PREFIX",
    "KeepaliveVolumes",
    "arch_of",
    "install",
    "keepalive_path",
    "program",
    "sweep_volumes",
    "volume_mount",
]

#: The keepalive's folder (a random suffix per container): the root always exists and is a folder.
KEEPALIVE_PREFIX = "/.agentcompass-keepalive-"
#: The program's name in that folder.
_NAME = "keepalive"
#: Labels of a volume's holder (:class:`KeepaliveVolume`): the volume's name, and the run's id.
HOLDER_LABEL = "agentcompass.keepalive"
HOLDER_RUN_LABEL = "agentcompass.keepalive-run"
log = logging.getLogger("pytest_agentcompass")

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


def keepalive_path() -> str:
    """A new path for a container's keepalive: in a folder with a random name."""
    return f"{KEEPALIVE_PREFIX}{secrets.token_hex(8)}/{_NAME}"


def install(api: Any, container_id: str, keepalive: tuple[str, bytes] | None, dirs: Sequence[str] = ()) -> None:
    """Write the program ``keepalive`` (its path, its bytes; its folder too) and the absolute folders
    ``dirs`` (mode 0777: whoever runs there writes to them) into the created, not yet started
    container, in one engine request (blocking; each archive call costs the engine tens of
    milliseconds)."""
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        if keepalive is not None:
            path, data = keepalive
            archive.addfile(dir_entry(posixpath.dirname(path).strip("/"), 0o555))
            archive.addfile(_file_entry(path.lstrip("/"), data), io.BytesIO(data))
        for folder in dirs:
            archive.addfile(dir_entry(folder.strip("/"), 0o777))
    api.put_archive(container_id, "/", payload.getvalue())


def _file_entry(name: str, data: bytes) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.size, entry.mode, entry.mtime = len(data), 0o555, int(time.time())
    return entry


def volume_mount(keepalive: str, volume: str) -> dict[str, Any]:
    """The host-config mount of ``volume`` at the folder of the path ``keepalive``, read-only (what runs
    there cannot change the program the engine's other containers run too)."""
    return _mount(posixpath.dirname(keepalive), volume, read_only=True)


def _mount(target: str, volume: str, read_only: bool) -> dict[str, Any]:
    """A host-config mount of ``volume`` at ``target``; ``NoCopy``: nothing of the image at ``target``
    is copied into the volume."""
    options = {"NoCopy": True}
    return {"Target": target, "Source": volume, "Type": "volume", "ReadOnly": read_only, "VolumeOptions": options}


@dataclass(frozen=True)
class KeepaliveVolume:
    """A volume holding the keepalive, and the container that holds it: created, never started, kept
    until the volume goes, so the engine counts the volume in use (``docker volume prune`` and
    ``docker volume rm`` leave it alone; a missing volume would be made again, empty, by the next
    container's mount)."""

    name: str
    holder: str


def make_volume(client: Any, image: str, data: bytes, labels: Mapping[str, str]) -> KeepaliveVolume:
    """A new volume holding the program ``data`` as ``keepalive`` (blocking; once per engine).

    Written through its holder, a container of ``image`` (a volume has no
    archive API of its own), and read back: an engine that does not write
    into a volume of a container that never started fails here, not at every
    container's start. ``NoCopy``: the volume starts empty, whatever the image
    holds at the mount's path.
    """
    api = client.api
    name = f"agentcompass-keepalive-{secrets.token_hex(6)}"
    api.create_volume(name, labels={"agentcompass": "1", **labels})  # the run's: a killed run's sweep finds it
    # Not the labels of the run's environments (``agentcompass``, ``agentcompass.run``): what counts or
    # lists a run's containers does not see it, and the sweep of its volumes removes it first.
    run, process = labels.get("agentcompass.run", ""), labels.get(PROCESS_LABEL, "")
    holder_labels = {
        HOLDER_LABEL: name,
        **({HOLDER_RUN_LABEL: run} if run else {}),
        **({PROCESS_LABEL: process} if process else {}),
    }
    holder = ""
    try:
        target = f"/{name}"
        mount = _mount(target, name, read_only=False)  # the one mount that writes the program
        holder = api.create_container(
            image,
            command=[f"{target}/{_NAME}"],
            entrypoint=[],
            name=f"{name}-holder",
            labels=holder_labels,
            network_disabled=True,
            host_config=api.create_host_config(mounts=[mount], network_mode="none"),
        )["Id"]
        payload = io.BytesIO()
        with tarfile.open(fileobj=payload, mode="w") as archive:
            archive.addfile(_file_entry(_NAME, data), io.BytesIO(data))
        api.put_archive(holder, target, payload.getvalue())
        stream, stat = api.get_archive(holder, f"{target}/{_NAME}")
        for _ in stream:  # drained, so the connection goes back to the pool
            pass
        if int(stat.get("size", -1)) != len(data):
            raise RuntimeError(f"the engine did not write the program into volume {name} ({stat})")
    except BaseException:
        with contextlib.suppress(Exception):  # what failed first is the error to raise
            remove_volume(client, KeepaliveVolume(name, holder))
        raise
    return KeepaliveVolume(name, holder)


def remove_volume(client: Any, volume: KeepaliveVolume) -> bool:
    """Remove ``volume`` and its holder; ``False`` when another container still uses the volume."""
    if volume.holder:
        with contextlib.suppress(Exception):  # gone already (a sweep): the volume's removal says the rest
            client.api.remove_container(volume.holder, force=True)
    return _remove_volume(client, volume.name)


def _remove_volume(client: Any, name: str) -> bool:
    try:
        client.api.remove_volume(name)
    except Exception as exc:
        text = str(exc)
        if "no such volume" in text.lower():
            return True
        if "in use" in text:
            return False
        raise
    return True


def sweep_volumes(client: Any, run_id: str, process: str | None = None) -> int:
    """Remove the keepalive volumes of run ``run_id`` (a killed run's; its containers, their holders
    among them, are removed first) that no container uses; returns how many. A volume that cannot go
    is said, and does not stop the sweep of the rest. ``process``: only those that process made."""
    holders = run_filter(run_id, process, key=HOLDER_RUN_LABEL)
    for holder in client.containers.list(all=True, filters={"label": holders}):
        with contextlib.suppress(Exception):  # gone meanwhile; else its volume's removal says so
            holder.remove(force=True)
    removed = 0
    for volume in client.volumes.list(filters={"label": run_filter(run_id, process)}):
        try:
            removed += _remove_volume(client, volume.name)
        except Exception as exc:
            log.warning("keepalive volume %s of run %s was not removed: %s", volume.name, run_id, exc)
    return removed


def _refused(exc: BaseException) -> bool:
    """Whether the engine answered and refused (it will again), not that it could not be reached."""
    return getattr(exc, "status_code", None) is not None or isinstance(exc, RuntimeError)


class KeepaliveVolumes:
    """The volume each engine's containers run the keepalive from: made on an engine's first open,
    removed by :meth:`aclose`. An engine that refuses to make one has ``None``: its containers get
    the program written into each instead (:func:`install`); one that did not answer is asked again
    at its next open."""

    def __init__(self) -> None:
        #: Per engine name, the volume being made or made (and the client to remove it with).
        self._volumes: dict[str, asyncio.Future[tuple[Any, KeepaliveVolume] | None]] = {}

    async def volume(self, engine: str, client: Any, image: str, arch: str, labels: Mapping[str, str]) -> str | None:
        """The name of the keepalive volume on ``engine`` (made from a container of ``image`` the first
        time, labelled ``labels``), or ``None`` when the engine could not make one. ``engine`` names the
        engine and, once it came back from an outage, which comeback: each gets a volume of its own."""
        made = self._volumes.get(engine)
        if made is None:  # made in a task of its own: a cancelled open leaves it to finish, and aclose removes it
            made = self._volumes[engine] = asyncio.ensure_future(self._make(engine, client, image, arch, labels))
        found = await asyncio.shield(made)
        return found[1].name if found else None

    async def _make(
        self, engine: str, client: Any, image: str, arch: str, labels: Mapping[str, str]
    ) -> tuple[Any, KeepaliveVolume] | None:
        try:
            volume = await asyncio.to_thread(make_volume, client, image, program(arch), labels)
        except Exception as exc:
            if not _refused(exc):
                self._volumes.pop(engine, None)  # not answered: the next open asks again
            log.warning(
                "Docker engine %s: no keepalive volume (%s); each container gets the program written into it "
                "(an archive request each)",
                engine,
                exc,
            )
            return None
        return client, volume

    async def aclose(self) -> None:
        """Remove every volume made (after the containers that used it); one still in use is said, and
        the sweep of the run removes it once its container is gone."""
        volumes, self._volumes = self._volumes, {}
        for made in await asyncio.gather(*volumes.values(), return_exceptions=True):
            if not isinstance(made, tuple):
                continue
            client, volume = made
            try:
                if not await asyncio.to_thread(remove_volume, client, volume):
                    log.warning("keepalive volume %s was not removed: a container still uses it", volume.name)
            except Exception as exc:
                log.warning("keepalive volume %s was not removed: %s", volume.name, exc)
