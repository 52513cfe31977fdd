"""What every host command carries, and how what is left of one is found by it.

A command's environment is built from :func:`host_environment`, never
inherited whole, and holds three markers: ``AGENTCOMPASS_RUN=<run id>`` (the
run it belongs to), ``AGENTCOMPASS_PROCESS=<run id>/<process>`` (the process of
the run that started it, :func:`this_process`) and ``AGENTCOMPASS_EXEC=<token>``
(the one exec). When the
processes that should have ended a command's tree are gone (``kill -9`` of
pytest and its reapers, a command that killed its own reaper),
:func:`kill_marked` finds and kills what is left by its marker in ``/proc``.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import secrets
import signal
from collections.abc import Sequence
from pathlib import Path

from ._reaper import children_of

__all__ = [
    "BASE_VARIABLES",
    "EXEC_MARKER",
    "MARKER",
    "PROCESS_LABEL",
    "PROCESS_MARKER",
    "descendants",
    "find_marked",
    "host_environment",
    "kill_marked",
    "run_filter",
    "this_process",
]

#: The environment variable naming the run a command belongs to.
MARKER = "AGENTCOMPASS_RUN"
#: The environment variable naming one exec (for providers that must find its processes).
EXEC_MARKER = "AGENTCOMPASS_EXEC"
#: The environment variable naming the run and the process a command belongs to: ``<run id>/<process>``.
PROCESS_MARKER = "AGENTCOMPASS_PROCESS"
#: The label of what an Environment makes for a session that names the process it was made by.
PROCESS_LABEL = "agentcompass.process"

#: This process's name (:func:`this_process`): made at import, made again in a forked child.
_process = secrets.token_hex(4)


def _renew() -> None:
    global _process
    _process = secrets.token_hex(4)


os.register_at_fork(after_in_child=_renew)


def run_filter(run_id: str, process: str | None = None, key: str = "agentcompass.run") -> list[str]:
    """The engine's label filter for what run ``run_id`` made (``key``: the label that names the run),
    and with ``process`` only what that process of it made (:data:`PROCESS_LABEL`)."""
    return [f"{key}={run_id}", *([f"{PROCESS_LABEL}={process}"] if process else [])]


def this_process() -> str:
    """This process's name among the processes of a run (xdist's workers share their run's id):
    random, one per process (a forked child gets its own).

    A run whose cleanups overran the grace removes what it left open by the
    run's id and this name, not by the run's id alone: that would remove what
    the other workers are still running.
    """
    return _process


#: Host variables every command sees: what programs need to find tools, read text and tell
#: the time, none of what a CI job keeps in its environment for itself (keys, tokens).
BASE_VARIABLES = ("PATH", "LANG", "LANGUAGE", "LC_*", "TZ", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR")


@functools.lru_cache(maxsize=16)
def _names(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(fnmatch.translate(p) for p in (*BASE_VARIABLES, *patterns)))


def host_environment(passed: Sequence[str] = ()) -> dict[str, str]:
    """The variables of this process a command may see: :data:`BASE_VARIABLES` and the
    names or shell-style patterns in ``passed`` (``["PYTHONPATH", "CUDA_*"]``); nothing else."""
    wanted = _names(tuple(passed))
    return {name: value for name, value in os.environ.items() if wanted.fullmatch(name)}


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, found by parent pid in ``/proc``."""
    return children_of(pid)


def find_marked(value: str, variable: str = MARKER) -> list[int]:
    """The processes we may read, other than this one and its parent, whose environment holds
    ``<variable>=<value>``."""
    needle = f"{variable}={value}".encode()
    mine = {os.getpid(), os.getppid()}
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue  # gone, or another user's
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def kill_marked(value: str, variable: str = MARKER, rounds: int = 20) -> int:
    """SIGKILL every process we may signal whose environment holds ``<variable>=<value>``.

    Repeated until a scan finds none, since a dying process tree may fork
    meanwhile. Returns how many were killed.
    """
    killed: set[int] = set()
    for _ in range(rounds):
        found = find_marked(value, variable)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
    return len(killed)
