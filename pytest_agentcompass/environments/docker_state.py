"""What the engine itself knows of a container's state, and its snapshots (blocking; run in a thread).

The engine answers these from outside the container: ``diff`` compares its
file system with its image, ``top`` lists its processes with the host's own
``ps``, ``kill`` ends every process at once (its pid namespace goes with its
first process) and ``commit`` turns its file system into an image. An agent
inside cannot forge any of them, which is what a verifier needs from a runner
that must not trust the container's tools.

A snapshot image carries its container's labels (``agentcompass.run`` among
them), so a run that was killed leaves nothing :func:`sweep_snapshots` cannot
find; within a run, :class:`Snapshots` removes each one when its attempt ends.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from .markers import run_filter

__all__ = [
    "SNAPSHOT_REPOSITORY",
    "Change",
    "Process",
    "SnapshotTooLarge",
    "Snapshots",
    "changes",
    "environ",
    "freeze",
    "pause",
    "processes",
    "resume",
    "runner_processes",
    "sweep_snapshots",
    "why_stopped",
]

log = logging.getLogger("pytest_agentcompass")

#: Repository of snapshot images (the tag is random; the labels say whose it is).
SNAPSHOT_REPOSITORY = "agentcompass-snapshot"
#: The engine's init, bind-mounted (read-only) into every container started with ``init``: not the agent's.
_ENGINE_MOUNTS = frozenset({"/sbin/docker-init", "/usr/sbin/docker-init", "/dev/init"})
_KINDS = {0: "changed", 1: "added", 2: "deleted"}


@dataclass(frozen=True)
class Change:
    """A path that differs from the image: ``kind`` is ``changed``, ``added`` or ``deleted``."""

    kind: str
    path: str


@dataclass(frozen=True)
class Process:
    """A process of the container as the host sees it (host pids)."""

    pid: int
    ppid: int
    state: str
    args: str

    @property
    def stopped(self) -> bool:
        return self.state.startswith("T")


def changes(container: Any) -> list[Change]:
    """Every path the container changed relative to its image (the engine's ``docker diff``)."""
    found = container.diff() or []
    return [
        Change(_KINDS.get(int(item.get("Kind", 0)), "changed"), str(item["Path"]))
        for item in found
        if item.get("Path") not in _ENGINE_MOUNTS
    ]


def processes(container: Any) -> list[Process]:
    """The container's processes (``docker top``: the host's ``ps``, not the container's); none if stopped."""
    try:
        listed = container.top(ps_args="-o pid,ppid,stat,args")
    except Exception as exc:  # a stopped container has no processes to list
        if "is not running" in str(exc):
            return []
        raise
    titles = [t.upper() for t in listed.get("Titles") or []]
    rows = []
    for row in listed.get("Processes") or []:
        fields = dict(zip(titles, row, strict=False))
        rows.append(
            Process(
                int(fields.get("PID", 0)),
                int(fields.get("PPID", 0)),
                str(fields.get("STAT", "")),
                str(fields.get("COMMAND", fields.get("ARGS", ""))),
            )
        )
    return rows


def runner_processes(container: Any, wait: float = 10.0) -> frozenset[int]:
    """The host pids of a container just started: its init and the keepalive the init runs, before
    anything else could run in it. They are the runner's own, known by pid from now on, never by
    command line (an agent can name its process anything). Waits (up to ``wait`` seconds) until the
    init has its child; a container without one keeps just its init (one that already stopped, none)."""
    deadline = time.monotonic() + wait
    while True:
        procs = processes(container)
        pids = {p.pid for p in procs}
        if not procs or any(p.ppid in pids for p in procs) or time.monotonic() >= deadline:
            return frozenset(pids)
        time.sleep(0.02)


def environ(container: Any) -> list[str]:
    """The container's configured environment (``KEY=value``): ``PATH`` among it."""
    config = container.client.api.inspect_container(container.id).get("Config") or {}
    return [str(e) for e in config.get("Env") or []]


def why_stopped(container: Any) -> str:
    """What the engine says of a container that is no longer running: how it ended (its exit code, an
    out-of-memory kill, the engine's error), or that it is gone altogether."""
    short = str(container.id)[:12]
    try:
        state = container.client.api.inspect_container(container.id).get("State") or {}
    except Exception as exc:  # removed meanwhile (a 404), or the engine failed: said as it is
        return f"container {short} is gone ({exc})"
    how = [f"{state.get('Status') or 'stopped'}, exit code {state.get('ExitCode')}"]
    if state.get("OOMKilled"):
        how.append("killed for want of memory (OOMKilled: the task's memory limit, or the host's)")
    if state.get("Error"):
        how.append(f"engine error: {state['Error']}")
    if state.get("FinishedAt") and not str(state["FinishedAt"]).startswith("0001-"):
        how.append(f"at {state['FinishedAt']}")
    return f"container {short} is not running any more ({'; '.join(how)}): nothing more can run in it"


def pause(container: Any) -> None:
    """Suspend every process of the container (the cgroup freezer): none runs until :func:`resume`."""
    container.client.api.pause(container.id)


def resume(container: Any) -> None:
    container.client.api.unpause(container.id)


def freeze(container: Any) -> None:
    """End every process of the container at once (SIGKILL to its first process) and wait for it to stop."""
    api = container.client.api
    try:
        api.kill(container.id)
    except Exception as exc:
        if "is not running" not in str(exc):
            raise
    api.wait(container.id, timeout=60)


class SnapshotTooLarge(Exception):
    """The container changed more than a snapshot may hold (the agent's doing, not the engine's)."""


#: Seconds a commit may take (the client's own 60 s would give up on a large one while it goes on).
COMMIT_TIMEOUT = 900.0


class Snapshots:
    """The snapshot images of one provider, by ``(task id, attempt)``: one at a time per attempt."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: key -> (client, image id)
        self._images: dict[tuple[str, int], tuple[Any, str]] = {}

    def take(self, container: Any, key: tuple[str, int], limit_bytes: int) -> str:
        """Commit the (frozen) ``container`` as the snapshot of ``key``; an older one of ``key`` goes.

        A commit copies every changed file in full, a sparse one too: a container
        whose changes add up to more than ``limit_bytes`` is not committed.

        :raises SnapshotTooLarge: naming the size and the limit.
        """
        self.release(key)
        api = container.client.api
        inspected = api._result(api._get(api._url("/containers/{0}/json", container.id), params={"size": 1}), True)
        size = int(inspected.get("SizeRw") or 0)
        if size > limit_bytes:
            raise SnapshotTooLarge(
                f"the task's container holds {_gb(size)} of changes (a sparse file counts whole), more than a "
                f"snapshot may hold ({_gb(limit_bytes)}, environment.params.snapshot_limit_mb): it cannot be verified"
            )
        params = {"container": container.id, "repo": SNAPSHOT_REPOSITORY, "tag": secrets.token_hex(8)}
        made = api._result(api._post_json(api._url("/commit"), data={}, params=params, timeout=COMMIT_TIMEOUT), True)
        image = str(made["Id"])
        with self._lock:
            self._images[key] = (container.client, image)
        return image

    def image(self, key: tuple[str, int]) -> str | None:
        with self._lock:
            found = self._images.get(key)
        return found[1] if found else None

    def release(self, key: tuple[str, int]) -> None:
        """Remove the snapshot of ``key`` (one a kept container still uses stays: ``keep_environment``)."""
        with self._lock:
            found = self._images.pop(key, None)
        if found is not None:
            _remove_image(*found)

    def release_all(self) -> None:
        with self._lock:
            keys = list(self._images)
        for key in keys:
            self.release(key)


def _gb(size: int) -> str:
    return f"{size / 1024**3:.1f} GB" if size >= 1024**3 else f"{size / 1024**2:.0f} MB"


def _remove_image(client: Any, image: str) -> None:
    try:
        client.images.remove(image, force=False, noprune=False)
    except Exception as exc:
        text = str(exc)
        if "No such image" in text:
            return
        if "conflict" in text.lower():  # a kept container (keep_environment) still uses it: it stays with it
            log.info("snapshot image %s kept: a kept container uses it", image[:19])
            return
        log.warning("snapshot image %s was not removed: %s", image[:19], exc)


def sweep_snapshots(client: Any, run_id: str, process: str | None = None) -> int:
    """Remove the snapshot images of run ``run_id`` (a killed run's; with ``process``, those of the
    containers that process made); returns how many."""
    found = client.images.list(filters={"label": run_filter(run_id, process)})
    for image in found:
        _remove_image(client, image.id)
    return len(found)
