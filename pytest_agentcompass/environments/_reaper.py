"""The reaper server behind the ``local`` provider's ``exec`` (a standalone script: stdlib only).

Started once per pytest process as ``python -I -S _reaper.py`` with a Unix
socket on stdin. For every command it receives (a JSON request plus four
file descriptors: stdout, stderr, a control socket and a status pipe) it forks
a *per-exec reaper*: a process marked ``PR_SET_CHILD_SUBREAPER``, so every
process the command starts stays its descendant, whatever it does (a
``setsid``, a double fork, a daemon that closes its pipes). When the
command's first process exits, or the control socket reaches end of file (the
caller timed out, was cancelled, closed the session, or died, even by
``kill -9``), the reaper kills every descendant, reaps them, and writes one
JSON status line. Forking a small, single-threaded server costs about a
millisecond, where starting an interpreter per command would cost a hundred.

Why not the alternatives: a process group or session is left by one
``setsid``; an environment marker scanned in ``/proc`` is left by ``env -i``
and costs a scan per command; a cgroup needs a delegated hierarchy that CI
runners and containers rarely give. The marker is still set (by the caller),
as a last resort for sweeping processes whose reaper was killed too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from typing import Any

_PR_SET_CHILD_SUBREAPER = 36
_HEADER = struct.Struct("!Q")


def _load_prctl() -> Any:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):
        return None  # not Linux: process groups are all there is


_prctl: Any = None


def become_subreaper() -> bool:
    prctl = _prctl or _load_prctl()
    return prctl is not None and bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def children_of(root: int) -> list[int]:
    """Every live descendant of ``root`` (by parent pid, from ``/proc``)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class ExecReaper:
    def __init__(self, request: dict[str, object], fds: list[int]) -> None:
        self.request = request
        self.out, self.err, self.control, self.status = fds
        self.main = 0
        self.main_status: int | None = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    def run(self) -> None:
        subreaper = become_subreaper()
        try:
            # For the caller, should the command stop this process: then it kills it (see process.py).
            os.write(self.control, b"%d" % os.getpid())
        except OSError:
            pass  # the caller is gone already: the select below sees it
        request = self.request
        try:
            # Popen, not fork + exec: it uses vfork, several times cheaper on some virtual machines.
            proc = subprocess.Popen(
                [str(a) for a in request["argv"]],  # type: ignore[attr-defined]
                stdin=subprocess.DEVNULL,
                stdout=self.out,
                stderr=self.err,
                cwd=str(request["cwd"]),
                env=dict(request["env"]),  # type: ignore[call-overload]
                start_new_session=True,  # its own session: signals for the reaper's group never reach it
            )
        except OSError as exc:
            self._finish({"errno": exc.errno or 8})
        self.main = proc.pid
        for fd in (self.out, self.err):
            os.close(fd)
        while self.main_status is None:
            ready, _, _ = select.select([self.control, self.wake_r], [], [])
            self._reap()
            if self.control in ready and self.main_status is None:
                self._kill_all(subreaper)
        self._kill_all(subreaper)  # also on success: nothing started by the command outlives it
        status = self.main_status
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self._finish({"returncode": code})

    def _reap(self) -> bool:
        """Collect exited children; whether any child (hence any descendant) is left."""
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.main:
                self.main_status = status

    def _kill_all(self, subreaper: bool) -> None:
        """SIGKILL every descendant until none is left (a forking one reappears as our child)."""
        me = os.getpid()
        # A subreaper with no child has no descendant at all: the usual case costs no /proc scan.
        while self._reap() or not subreaper:
            victims = children_of(me)
            if not subreaper and self.main:
                try:
                    os.killpg(self.main, signal.SIGKILL)  # the best we can do without a subreaper
                except OSError:
                    pass
            if not victims:
                return
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            select.select([self.wake_r], [], [], 0.05)  # woken by the first SIGCHLD

    def _finish(self, status: dict[str, int]) -> None:
        os.write(self.status, (json.dumps(status) + "\n").encode())
        os._exit(0)


def _recv_exact(sock: socket.socket, size: int, first: bytes = b"") -> bytes:
    data = bytearray(first)
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


def _reap_all(*_: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def serve(sock: socket.socket) -> None:
    global _prctl
    _prctl = _load_prctl()  # once here, not in every forked reaper (importing ctypes takes milliseconds)
    # Reaped here rather than by SIG_IGN, so their CPU time counts as ours (and then as pytest's).
    signal.signal(signal.SIGCHLD, _reap_all)
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 4, socket.MSG_CMSG_CLOEXEC)
            if not head:
                break  # the caller is gone
            (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, head))
            request = json.loads(_recv_exact(sock, size))
        except (EOFError, OSError):
            break
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            sock.close()
            try:
                ExecReaper(request, fds).run()
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
    # The caller is gone: wait for the per-exec reapers, which are killing their commands now.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        while True:
            os.wait()
    except ChildProcessError:
        pass


if __name__ == "__main__":
    serve(socket.socket(fileno=sys.stdin.fileno()))
