"""A ``docker`` exec's two hard parts: reading its output, and killing what it started.

Docker has no call to kill an exec, and its SDK's own reading lost output
and timed out quiet commands; both are done here, for
:meth:`.docker_session.DockerSession.exec` (its contract: base.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

from .markers import EXEC_MARKER, kill_marked

__all__ = ["DRAIN_GRACE", "INIT", "KILL_PATIENCE", "ExecStream", "exec_output", "kill_exec"]

log = logging.getLogger("pytest_agentcompass")

#: The engine's init (tini), mounted here in every container started with ``init`` (as ours are).
#: Each exec runs under one of its own, a subreaper (``-s``): every process the command starts
#: stays in its tree, a ``setsid`` and a double fork whose parent died too (orphans go to the
#: nearest subreaper, not to pid 1); and it never execs, so it keeps the exec's token in its
#: environment whatever the command does to its own (``unset``, ``env -i``).
INIT = ["/sbin/docker-init", "-s", "--"]
#: Seconds the output may stay open after the kill before the connection is shut (a process that
#: could not be killed, or a stuck engine, must not hold the exec past its timeout).
DRAIN_GRACE = 5.0
#: Seconds the kill keeps trying while the engine still reports the exec running.
KILL_PATIENCE = 10.0

# Runs inside the container (as root, then as the exec's user: see kill_exec) with
# ``AGENTCOMPASS_EXEC=<token>`` as $1. The exec's processes are the ones whose environment holds
# it (its init above, whose parent is outside the container, so its ppid is 0) and every process
# whose parent chain leads to one of them. Each round stops them all (none forks or runs its next
# command meanwhile), then kills all but the init: kept, stopped, to the end, so what it adopts
# stays in the tree for the next round. The init goes when nothing else is left. Prints the pids
# still alive if the rounds ran out.
_KILLER = r"""
t=$1
scan() {
  all=; tree=; init=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}; [ "$p" = $$ ] && continue
    read -r s 2>/dev/null < "$d/stat" || continue
    s=${s##*) }; set -- $s; [ "$1" = Z ] && continue
    all="$all $p:$2"
    if grep -qs "$t" "$d/environ"; then tree="$tree $p "; [ "$2" = 0 ] && init=$p; fi
  done
  grown=1
  while [ $grown = 1 ]; do
    grown=0
    for e in $all; do
      case "$tree" in *" ${e%:*} "*) continue;; *" ${e#*:} "*) tree="$tree ${e%:*} "; grown=1;; esac
    done
  done
}
i=0
while [ $i -lt 50 ]; do
  i=$((i+1)); scan
  rest=; for p in $tree; do [ "$p" = "$init" ] || rest="$rest $p"; done
  [ -z "$tree" ] && exit 0
  kill -STOP $tree 2>/dev/null
  if [ -n "$rest" ]; then kill -9 $rest 2>/dev/null; else kill -9 $init 2>/dev/null; fi
done
echo $tree
"""


class ExecStream:
    """The output of a started exec: its ``(stdout, stderr)`` frames, to the end, and a way to stop them."""

    def __init__(self, frames: Iterator[tuple[bytes | None, bytes | None]], connection: Any) -> None:
        self._frames = frames
        self._connection = connection
        #: Set by :meth:`abort`: the frames ended because the connection was shut, not with the exec.
        self.aborted = False

    def __iter__(self) -> Iterator[tuple[bytes | None, bytes | None]]:
        return self._frames

    def abort(self) -> None:
        """Shut the connection, so a read blocked on it in another thread returns now."""
        self.aborted = True
        shutdown = getattr(getattr(self._connection, "_sock", self._connection), "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):  # closed already, or not a socket to shut
                shutdown(socket.SHUT_RDWR)


def exec_output(api: Any, exec_id: str) -> ExecStream:
    """Start exec ``exec_id``; returns its output stream (see :class:`ExecStream`).

    Not the SDK's ``exec_start(stream=True)``: it reads the hijacked socket
    under the HTTP response's buffered reader, so frames that arrived with the
    headers (a fast command's whole output, on a busy machine or over TCP) sat
    in that buffer and were lost: exit 0 and empty output. Reading frames
    through the buffered reader itself keeps them.
    """
    response = api._post_json(  # the SDK's own request (see its exec_start), kept open
        api._url("/exec/{0}/start", exec_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        data={"Tty": False, "Detach": False},
        stream=True,
    )
    connection = api._get_raw_response_socket(response)  # raises for an error status
    # The client's request timeout (60 s) would end a quiet command's stream with a TimeoutError;
    # how long an exec may take is the caller's timeout, which the exec enforces itself.
    api._disable_socket_timeout(connection)
    reader = getattr(getattr(response.raw, "_fp", None), "fp", None)
    if not isinstance(reader, io.BufferedReader):  # ssh:// and named pipes: the SDK's reader
        return ExecStream(iter(api._read_from_socket(response, True, tty=False, demux=True)), connection)
    return ExecStream(_frames(response, reader), connection)  # started by now: the caller may kill it at once


def _frames(response: Any, reader: io.BufferedReader) -> Iterator[tuple[bytes | None, bytes | None]]:
    try:
        while len(header := reader.read(8)) == 8:
            kind, size = struct.unpack(">BxxxL", header)
            data = reader.read(size)
            yield (data, None) if kind == 1 else (None, data)
    finally:
        response.close()


def kill_exec(api: Any, container_id: str, exec_id: str, token: str, user: str, local: bool) -> bool:
    """Kill every process of exec ``exec_id`` inside its container (Docker cannot kill an exec).

    ``user`` is the exec's ("": the image's). The kill runs as root, which can
    signal anyone but, without ``CAP_SYS_PTRACE`` (not granted by default),
    cannot read another user's ``/proc/<pid>/environ``: the processes of a
    command run as someone else are found by a kill run as that user.
    ``local``: the engine shares this kernel (see :func:`_run_killer`).

    :returns: whether the exec's main process is gone and the kill left nothing it knows of.
    """
    deadline = time.monotonic() + KILL_PATIENCE
    while True:
        left = _run_killer(api, container_id, token, "0", local)
        info = api.exec_inspect(exec_id)
        if info.get("Running") and user not in ("0", "root"):
            left = _run_killer(api, container_id, token, user, local) or left
            info = api.exec_inspect(exec_id)
        if not info.get("Running") and (info.get("Pid") or info.get("ExitCode") is not None):
            return not left
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # started but not running yet: kill it once it is


def _run_killer(api: Any, container_id: str, token: str, user: str, local: bool) -> bool:
    """Run :data:`_KILLER` in the container as ``user``; returns whether processes of the exec may be left."""
    try:
        killer = api.exec_create(container_id, ["sh", "-c", _KILLER, "killer", f"{EXEC_MARKER}={token}"], user=user)
        left = api.exec_start(killer["Id"]).strip()
    except Exception as exc:  # an image without sh
        log.debug("cannot run the in-container kill: %s", exc)
        left = b"?"
    if left and local:
        # Where this process sees the container's processes (same kernel, enough rights), the
        # marked ones can still be killed from here. Only now: killing the exec's init first
        # would hand its tree to the container's pid 1, out of the killer's reach.
        kill_marked(token, EXEC_MARKER)
    return bool(left)
