"""Host processes for providers: run a command so that nothing it starts outlives it.

:func:`run_reaped` hands every command to a per-exec reaper (see
``_reaper.py``) forked from one small server process per pytest process. The
command returns as soon as its first process exits, with that process's exit
code; everything else it started is killed then, on timeout, on cancel, on
:meth:`ExecControls.kill_all` (a session's close), and when pytest dies.

A command's environment is built, never inherited: :func:`.markers.host_environment`
gives it the few host variables programs need to run (``PATH``, the locale,
...) and the ones a config names, never the rest of pytest's (API keys, CI
tokens). Every command also carries ``AGENTCOMPASS_RUN=<run id>`` in its environment:
if pytest *and* the reapers were killed (``kill -9`` of the process group),
:func:`.markers.kill_marked` finds what is left by that marker when the run is resumed;
and ``AGENTCOMPASS_PROCESS=<run id>/<process>``, by which a run whose cleanups overran
the grace finds its own commands, not those another xdist worker of the run still runs.
And a token of its own, ``AGENTCOMPASS_EXEC``: a command that kills or stops
its own reaper (it is the command's parent) leaves nobody to kill its tree,
so then the caller does, by that token (see :class:`_Reaped`).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._reaper import _HEADER
from .capture import StreamCapture
from .markers import EXEC_MARKER, kill_marked

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "Completed",
    "ExecControls",
    "run_reaped",
    "shutdown_reaper",
]

#: Bytes of stdout/stderr kept per stream; the rest is counted and dropped.
DEFAULT_OUTPUT_LIMIT = 1024 * 1024
_CHUNK = 64 * 1024
#: How long to wait for the reaper's report after asking it to kill (it takes milliseconds).
_KILL_WAIT = 10.0
#: How often a reaper that has not answered yet is checked for being stopped meanwhile.
_STOPPED_CHECK = 0.25


class _ReaperServer:
    """The process-wide reaper server, started on first use and again if it died or we forked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = 0

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        script = Path(__file__).with_name("_reaper.py")
        with theirs:
            # -I -S: no site, no user paths; the script needs only the standard library.
            # Its own session: a Ctrl-C or a kill of pytest's process group leaves the reapers
            # alive to see their control sockets close and kill what the commands started.
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(script)], stdin=theirs.fileno(), close_fds=True, start_new_session=True
            )
        self._sock, self._owner = ours, os.getpid()
        return ours

    def spawn(self, request: Mapping[str, object], fds: Sequence[int]) -> None:
        payload = json.dumps(request).encode()
        with self._lock:
            for attempt in (1, 2):
                sock = self._sock if self._sock is not None and self._owner == os.getpid() else None
                if sock is None or (self._proc is not None and self._proc.poll() is not None):
                    sock = self._start()
                try:
                    socket.send_fds(sock, [_HEADER.pack(len(payload))], list(fds))
                    sock.sendall(payload)
                    return
                except OSError:
                    self._sock = None  # the server died between two commands: start another
                    if attempt == 2:
                        raise

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the server and wait for it (and its reapers: call it with no command running).

        The next spawn starts another. Called when the plugin unconfigures (the server sees
        its socket close and exits), and by measurements, so the server's CPU time is counted.
        A server still busy after ``timeout`` is left to finish on its own (its own session).
        """
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._proc is not None and self._owner == os.getpid():
                try:
                    self._proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    return  # still reaping: it exits when its reapers do
            self._proc = None


_server = _ReaperServer()
shutdown_reaper = _server.shutdown


class _Reaped:
    """One command under its per-exec reaper, as the caller sees it.

    The reaper writes its pid into the control socket when it starts; it is
    read only when the command is to be killed. A reaper the command stopped
    (``kill -STOP $PPID``) is killed itself, and one that died (``kill -9
    $PPID``) or does not answer is replaced by a scan of ``/proc`` for the
    exec's token: only then, a normal exec costs no scan.
    """

    def __init__(self, control: socket.socket, token: str, reported: asyncio.Future[dict[str, int]]) -> None:
        self.control: socket.socket | None = control
        self.token = token
        self.reported = reported
        self.reaper = 0
        self._settling: asyncio.Future[None] | None = None

    @property
    def answered(self) -> bool:
        """The reaper said it killed everything (or that the command could not start)."""
        if not self.reported.done():
            return False
        report = self.reported.result()
        return "returncode" in report or "errno" in report

    def kill_tree(self) -> None:
        """Ask the reaper to kill the command's tree (it sees its control socket close)."""
        if self.control is None:
            return
        if not self.reported.done():
            self.reaper = _reaper_pid(self.control)
        self.control.close()
        self.control = None
        if self.reaper and _stopped(self.reaper):
            _kill_reaper(self.reaper)  # it would never see the socket close

    async def settle(self) -> None:
        """Wait until the reaper reports; if it cannot, kill what carries the exec's token."""
        if self.answered:
            return  # the usual case: no task, no scan
        if self._settling is None:
            # One for every caller (the exec itself and the session's close), shielded from their cancels.
            self._settling = asyncio.ensure_future(self._settle())
        await asyncio.shield(self._settling)

    async def _settle(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _KILL_WAIT
        while not self.reported.done() and loop.time() < deadline:
            await asyncio.wait([self.reported], timeout=_STOPPED_CHECK)
            if not self.reported.done() and self.reaper and _stopped(self.reaper):
                _kill_reaper(self.reaper)  # stopped after kill_tree() looked (a SIGSTOP lands late)
        if not self.reported.done() and self.reaper:
            # No answer in time (stuck): the reaper goes too.
            _kill_reaper(self.reaper)
            await asyncio.wait([self.reported], timeout=_KILL_WAIT)  # its status pipe closes as it dies
        if not self.answered:
            # Its children are now orphans (reparented to init): found by the token they inherited.
            await asyncio.to_thread(kill_marked, self.token, EXEC_MARKER)


def _reaper_pid(control: socket.socket) -> int:
    try:
        return int(control.recv(32, socket.MSG_DONTWAIT) or 0)
    except (OSError, ValueError):
        return 0  # not written yet: the reaper has not run


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (by a signal or a tracer)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] in (b"T", b"t")


def _kill_reaper(pid: int) -> None:
    """SIGKILL ``pid`` if it is still a reaper (its status pipe is open, so it should be: checked anyway)."""
    try:
        if b"_reaper.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


class ExecControls:
    """A session's running commands; killing one makes its reaper kill everything it started."""

    def __init__(self) -> None:
        self._open: dict[int, _Reaped] = {}
        #: A command's reaper did not say in time that it killed everything (its processes may live on).
        self.unanswered = False

    def add(self, command: _Reaped) -> None:
        self._open[id(command)] = command

    def kill(self, command: _Reaped) -> None:
        if self._open.pop(id(command), None) is not None:
            command.kill_tree()

    async def kill_all(self) -> bool:
        """Kill every running command of the session and wait until its reaper says it is done.

        :returns: whether every reaper of the session's commands said so in
            time, these and the ones of commands killed before (a timed-out exec).
        """
        running = list(self._open.values())
        for command in running:
            self.kill(command)
        if running:
            await asyncio.gather(*(command.settle() for command in running))
            if not all(command.answered for command in running):
                self.unanswered = True
        return not self.unanswered


class _Drain:
    """Reads a pipe on the loop into a capped buffer until end of file."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, limit: int) -> None:
        self.loop, self.fd = loop, fd
        self.capture = StreamCapture(limit)
        self.done: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self.fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self.capture.add(chunk)
            return
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if not self.done.done():
            self.done.set_result(None)


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    #: Characters dropped past the output limit.
    stdout_omitted: int = 0
    stderr_omitted: int = 0


async def run_reaped(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    timeout: float | None,
    output_limit: int,
    controls: ExecControls,
) -> Completed:
    """Run ``argv`` under a reaper; see the module docstring.

    :raises OSError: when the command cannot be started (its ``errno`` is kept).
    """
    loop = asyncio.get_running_loop()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # A socket, not a pipe: the reaper writes its pid back on it, read only if it must be killed.
    control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    st_r, st_w = os.pipe()
    token = secrets.token_hex(8)
    try:
        request = {"argv": list(argv), "env": {**env, EXEC_MARKER: token}, "cwd": cwd}
        _server.spawn(request, [out_w, err_w, theirs.fileno(), st_w])
    except BaseException:
        for fd in (out_r, err_r, st_r):
            os.close(fd)
        control.close()
        raise
    finally:
        for fd in (out_w, err_w, st_w):
            os.close(fd)
        theirs.close()
    # From here on nothing awaits outside the try below, so a cancel always reaches the kill.
    out, err, status = _Drain(loop, out_r, output_limit), _Drain(loop, err_r, output_limit), _Drain(loop, st_r, 4096)
    reported: asyncio.Future[dict[str, int]] = loop.create_future()

    def on_status(_: object) -> None:
        if not reported.done():
            reported.set_result(_parse(status.capture.kept))

    status.done.add_done_callback(on_status)
    command = _Reaped(control, token, reported)
    controls.add(command)
    timed_out = False
    try:
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(reported)
                if not command.answered:
                    # The reaper died without a word (the command killed it): the
                    # command's end is now only seen as its output closing.
                    await asyncio.wait([out.done, err.done])
        except TimeoutError:
            timed_out = True
    finally:
        controls.kill(command)  # kills the tree unless it is gone already
        try:
            try:
                await command.settle()
            finally:
                if not command.answered:
                    controls.unanswered = True  # the session's close keeps nothing it may still use
            # Every writer is dead once the reaper reported, so these end at once.
            await asyncio.wait([out.done, err.done], timeout=_KILL_WAIT)
        finally:
            for drain in (out, err, status):
                drain.close()
    report = reported.result() if reported.done() else {}
    if "errno" in report:
        raise OSError(report["errno"], os.strerror(report["errno"]))
    stdout, stderr = out.capture.text(), err.capture.text()
    return Completed(
        returncode=int(report.get("returncode", -signal.SIGKILL)),
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=out.capture.cut,
        stderr_truncated=err.capture.cut,
        timed_out=timed_out,
        stdout_omitted=out.capture.omitted,
        stderr_omitted=err.capture.omitted,
    )


def _parse(raw: bytearray) -> dict[str, int]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}  # the reaper died before it reported
    return {k: int(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}
