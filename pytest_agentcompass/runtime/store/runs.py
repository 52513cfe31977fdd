"""Whole run directories: naming, finding, claiming, locking, and copying carried-over details.

``<output_dir>/<request>/`` holds one folder per run. A run is *claimed* by one
process through an exclusive ``flock`` on ``run.lock``; it is resumable while its
``run_info.json`` is not ``completed`` and no live process holds its lock.
Runs are ordered by the start ``run_info.json`` records (ids sort the same
way, as a fallback for folders without one).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ...concurrency.flock import try_lock
from ...vocabulary.errors import AgentCompassError
from ...vocabulary.types import RequestState
from .details import DetailFiles, holds_details
from .files import RUN_INFO, RunStore, read_run_info_head
from .run_ids import new_run_id, now

__all__ = [
    "LOCK_FILE",
    "claim_run_dir",
    "copy_details",
    "find_resumable_run",
    "find_carry_over_source",
    "iter_runs",
    "killed_runs",
    "new_run_id",
    "now",
    "record_killed",
    "release_run_dir",
]

LOCK_FILE = "run.lock"
#: A run that began and never ended: its process runs it, or was killed.
UNFINISHED = frozenset(state for state in RequestState if state.unfinished)


def _run_info(run_dir: Path) -> dict[str, Any] | None:
    try:
        info = read_run_info_head(run_dir / RUN_INFO)
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8
        return None
    return info if isinstance(info, dict) else None


def iter_runs(request_dir: Path, *, newest_first: bool = True) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every run directory of a request with its ``run_info``, by recorded start."""
    if not request_dir.is_dir():
        return
    runs = []
    for path in request_dir.iterdir():
        if path.is_dir() and not path.name.startswith("."):  # ".<id>...tmp": a run being created
            info = _run_info(path)
            if info is not None:
                runs.append((str(info.get("started_at") or ""), path.name, path, info))
    runs.sort(key=lambda r: (r[0], r[1]), reverse=newest_first)
    for _, _, path, info in runs:
        yield path, info


def killed_runs(run_dir: Path, *, include_current: bool) -> list[str]:
    """Runs of ``run_dir``'s request that never finished and whose process is gone (killed).

    A run whose lock or ``run_info`` names a live process is left alone: it may be running now.
    """
    found = [run_dir.name] if include_current else []
    for path, info in iter_runs(run_dir.parent, newest_first=False):
        if path == run_dir or info.get("status") not in UNFINISHED:
            continue
        try:
            holder = int((path / LOCK_FILE).read_text().strip() or 0)
        except (OSError, ValueError):
            holder = 0
        if not any(isinstance(pid, int) and pid > 0 and _alive(pid) for pid in (holder, info.get("pid"))):
            found.append(path.name)
    return found


def record_killed(run_dir: Path, reason: str) -> bool:
    """Record in a killed run's ``run_info.json`` that it ended ``interrupted``, once it has been swept.

    It stays resumable (only ``completed`` ends that), but no later run sweeps
    it again. Done under the run's lock, so a process resuming it at the same
    moment wins and nothing is written.
    """
    if str(run_dir) in _held or not _take_lock(run_dir):
        return False
    try:
        store = RunStore(run_dir)
        info = store.read_run_info()
        if info.get("status") not in UNFINISHED:
            return False
        info.update(status=RequestState.INTERRUPTED, stop_reason=reason, finished_at=info.get("finished_at") or now())
        store.write_run_info(info)
        return True
    finally:
        release_run_dir(run_dir)


def find_carry_over_source(request_dir: Path, spec: str, current: Path | None = None) -> Path:
    """Resolve ``carry_over: latest | <dir>`` to a run directory.

    :raises AgentCompassError: when there is nothing to carry over.
    """
    if spec != "latest":
        path = Path(spec)
        if not holds_details(path):
            raise AgentCompassError(f"carry_over: {path} is not a run directory (no details/ folder)")
        return path
    for path, _ in iter_runs(request_dir):
        if path != current and holds_details(path):
            return path
    raise AgentCompassError(f"carry_over: latest: no earlier run with results under {request_dir}")


def find_resumable_run(request_dir: Path, fingerprint: str) -> Path | None:
    """The newest unfinished run of this request made with the same settings, claimed for this process.

    The newest finished run ends the search: what came before it is history.
    """
    for path, info in iter_runs(request_dir):
        if info.get("status") == RequestState.COMPLETED:
            return None
        if info.get("fingerprint") == fingerprint and _take_lock(path):
            return path
    return None


#: Run directories this process holds: the open ``run.lock`` whose ``flock`` is the claim.
_held: dict[str, int] = {}


def _take_lock(run_dir: Path) -> bool:
    """Claim ``run_dir`` with an exclusive ``flock`` on its ``run.lock``, held until released.

    The pid written into the file is for people only.
    """
    key = str(run_dir)
    if key in _held:
        return True
    fd = try_lock(run_dir / LOCK_FILE)
    if fd is None:
        return False
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[key] = fd
    return True


def claim_run_dir(run_dir: Path, request: str, fingerprint: str, *, shared: bool = False) -> None:
    """Create (or take over) ``run_dir`` for this process; ``run_info.json`` exists from the first moment.

    A new run directory is assembled under a temporary name and renamed into
    place, so a kill at any point never leaves a run without its
    ``run_info.json``.

    :param shared: Several processes of one session write the run (xdist
        workers); the lock is then left to the controller.
    :raises AgentCompassError: when a live process holds the run.
    """
    if not run_dir.is_dir():
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_staging(run_dir.parent)
        staging = run_dir.parent / f".{run_dir.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp"
        staging.mkdir()
        store = RunStore(staging)
        store.keep_from_collection()  # before anything an agent writes can land in it
        store.write_run_info(
            {
                "run_id": run_dir.name,
                "request": request,
                "status": RequestState.CREATED,
                "fingerprint": fingerprint,
                "started_at": now(),
            }
        )
        try:
            staging.rename(run_dir)
        except OSError:  # another process of this session made it first (xdist workers)
            shutil.rmtree(staging, ignore_errors=True)
    if not shared and not _take_lock(run_dir):
        raise AgentCompassError(f"run directory {run_dir} is in use by another live process (see {LOCK_FILE})")
    RunStore(run_dir).keep_from_collection()  # a run made before the marker existed, resumed


def _remove_dead_staging(request_dir: Path) -> None:
    """Remove run directories a killed process was still assembling (``.<id>.<pid>.<tag>.tmp``)."""
    for path in request_dir.glob(".*.tmp"):
        try:
            pid = int(path.name.rsplit(".", 3)[-3])
        except (ValueError, IndexError):
            continue
        if not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def release_run_dir(run_dir: Path) -> None:
    """Give up this process's claim on ``run_dir``."""
    fd = _held.pop(str(run_dir), None)
    if fd is None:
        return
    # Removed before it is unlocked: a rival that opened the old file notices and retries.
    with contextlib.suppress(FileNotFoundError):
        (run_dir / LOCK_FILE).unlink()
    os.close(fd)


def copy_details(
    source: Path,
    store: RunStore,
    wanted: Callable[[str], bool],
    keep: Callable[[str, Mapping[str, Any]], bool],
) -> tuple[int, int]:
    """Copy into ``store`` the details of ``source`` whose task is ``wanted`` and that ``keep`` accepts.

    Returns ``(copied, skipped)``; unreadable details count as skipped.
    """
    copied = skipped = 0
    earlier = DetailFiles(source)
    for task_id in earlier.detail_ids():
        if not wanted(task_id):
            continue
        detail = earlier.read_detail(task_id)
        if detail is None or not keep(task_id, detail):
            skipped += 1
            continue
        store.copy_detail(earlier, task_id)
        copied += 1
    return copied, skipped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
