"""Run-wide limits for several processes: a permit service on a Unix socket.

Under pytest-xdist every worker runs tasks concurrently, while
``task_concurrency``, provider ``capacity`` and ``open_qps`` are promises
about the whole run. The controller serves them (:class:`PermitService`, one
thread); each worker holds one connection (:class:`PermitClient`).

Why a service and not lock files: waiting is first come, first served across
processes and a released permit wakes the next waiter at once, with no
polling. A worker that dies, even by ``kill -9``, leaves nothing behind: the
kernel closes its socket and the service frees what that connection held and
forgets its waiters.

The protocol is one line per message::

    client: acquire <id> <key> <limit> | cancel <id> | release <key> | slot <id> <key> <qps>
    server: grant <id> | slot <id> <delay seconds> | stop <reason> | interrupt <reason>

``stop`` is the run-wide ``-x``: the controller saw enough failures, so every
worker stops starting tasks (the ones running finish), as one process would.
``interrupt`` is a Ctrl-C that reached the controller alone (``kill -INT``):
every worker cancels what runs, within the cleanup grace, as one process would.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import selectors
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["PermitClient", "PermitService"]


@dataclass
class _Pool:
    limit: int
    in_use: int = 0
    waiters: deque[tuple[_Conn, str]] = field(default_factory=deque)


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    buffer: bytes = b""
    held: Counter[str] = field(default_factory=Counter)


class PermitService:
    """Counts permits and spaces open slots for every process of one session (the controller)."""

    def __init__(self) -> None:
        self._dir: str | None = None
        if sys.platform.startswith("linux"):
            # An abstract socket: no file, so a controller killed by -9 leaves nothing behind.
            self.address = f"\0agentcompass-permits-{os.getpid()}-{secrets.token_hex(8)}"
        else:
            self._dir = tempfile.mkdtemp(prefix="agentcompass-")
            self.address = os.path.join(self._dir, "permits.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._pools: dict[str, _Pool] = {}
        self._next_slot: dict[str, float] = {}
        self._closing = False
        self._stop: str | None = None
        self._lock = threading.Lock()  # the serving thread and stop_all() both write to clients
        #: Highest number of permits ever held at once, per key (tests read it).
        self.peak: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._serve, name="agentcompass-permits", daemon=True)
        self._thread.start()

    def stop_all(self, reason: str, *, interrupt: bool = False) -> None:
        """Tell every process, now and later ones, to start no more tasks (``interrupt``: and cancel
        the running ones). Idempotent, except that an interrupt still follows a stop."""
        kind = "interrupt" if interrupt else "stop"
        with self._lock:
            if self._stop is not None and (self._stop.startswith("interrupt ") or not interrupt):
                return
            self._stop = f"{kind} {' '.join(reason.split()) or kind}"
            conns = [k.data for k in self._selector.get_map().values() if isinstance(k.data, _Conn)]
        for conn in conns:
            self._send(conn, self._stop)

    def close(self) -> None:
        """Stop serving and remove the socket's folder. Idempotent."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout=5)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    # -- the serving thread ------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._closing:
                for key, _ in self._selector.select():
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        continue
                    else:
                        self._read(key.data)
        finally:
            for key in list(self._selector.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()
            self._wake_w.close()

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            sock, _ = self._listener.accept()
            sock.setblocking(True)  # replies are a few bytes; clients read them at once
            conn = _Conn(sock)
            with self._lock:
                self._selector.register(sock, selectors.EVENT_READ, conn)
                stop = self._stop
            if stop is not None:  # a replacement worker joins a run that is stopping
                self._send(conn, stop)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.buffer += data
        *lines, conn.buffer = conn.buffer.split(b"\n")
        for line in lines:
            self._handle(conn, line.decode().split())

    def _handle(self, conn: _Conn, words: list[str]) -> None:
        kind = words[0] if words else ""
        if kind == "acquire":
            ident, key, limit = words[1], words[2], int(words[3])
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = _Pool(limit)
            elif limit and (pool.limit == 0 or limit < pool.limit):
                pool.limit = limit  # the smallest limit wins, as within one process
            pool.waiters.append((conn, ident))
            self._wake(key, pool)
        elif kind == "cancel":
            for pool in self._pools.values():
                with contextlib.suppress(ValueError):
                    pool.waiters.remove((conn, words[1]))
        elif kind == "release":
            key = words[1]
            if conn.held[key] > 0:
                conn.held[key] -= 1
                pool = self._pools[key]
                pool.in_use -= 1
                self._wake(key, pool)
        elif kind == "slot":
            ident, key, qps = words[1], words[2], float(words[3])
            now = time.monotonic()
            slot = max(now, self._next_slot.get(key, 0.0))
            self._next_slot[key] = slot + 1.0 / qps
            self._send(conn, f"slot {ident} {slot - now:.6f}")

    def _wake(self, key: str, pool: _Pool) -> None:
        while pool.waiters and (pool.limit == 0 or pool.in_use < pool.limit):
            conn, ident = pool.waiters.popleft()
            pool.in_use += 1
            conn.held[key] += 1
            self.peak[key] = max(self.peak[key], pool.in_use)
            self._send(conn, f"grant {ident}")

    def _send(self, conn: _Conn, line: str) -> None:
        try:
            with self._lock:
                conn.sock.sendall(line.encode() + b"\n")
        except OSError:
            pass  # the peer is gone; its EOF frees what it holds

    def _drop(self, conn: _Conn) -> None:
        """A process went away (finished, or killed): free its permits, forget its waiters."""
        with self._lock, contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()
        for key, pool in self._pools.items():
            pool.waiters = deque(w for w in pool.waiters if w[0] is not conn)
            pool.in_use -= conn.held.get(key, 0)
            self._wake(key, pool)
        conn.held.clear()


class PermitClient:
    """One process's connection to the :class:`PermitService`; usable from any event loop or thread."""

    def __init__(self, address: str) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(address)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[float], str]] = {}
        self._abandoned: dict[str, str] = {}  # id -> key of acquires cancelled while in flight
        self._closed = False
        #: Called (in a reader thread) with the reason, and whether running tasks are
        #: cancelled too (an interrupt), when the run stops starting tasks.
        self.on_stop: Callable[[str, bool], None] | None = None
        self.stopped: str | None = None
        self.interrupted = False
        self._reader = threading.Thread(target=self._read, name="agentcompass-permits-client", daemon=True)
        self._reader.start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    async def acquire(self, key: str, limit: int) -> None:
        """Wait for one permit of ``key`` (run-wide ``limit``; the smallest non-zero one wins)."""
        ident, future = self._register(key)
        self._send(f"acquire {ident} {key} {limit}")
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if self._waiting.pop(ident, None) is not None:
                    self._abandoned[ident] = key  # a grant may already be on its way
                    pending = True
                else:
                    pending = False
            if pending:
                self._send(f"cancel {ident}")
            raise

    def release(self, key: str) -> None:
        self._send(f"release {key}")

    async def slot_delay(self, key: str, qps: float) -> float:
        """Reserve the next open slot of ``key`` at ``qps`` run-wide; returns how long to wait for it."""
        ident, future = self._register(key)
        self._send(f"slot {ident} {key} {qps}")
        return await future

    def _register(self, key: str) -> tuple[str, asyncio.Future[float]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[float] = loop.create_future()
        ident = str(next(self._ids))
        with self._lock:
            if self._closed:
                raise ConnectionError("the permit service connection is closed")
            self._waiting[ident] = (loop, future, key)
        return ident, future

    def _send(self, line: str) -> None:
        try:
            with self._lock:
                self._sock.sendall(line.encode() + b"\n")
        except OSError as exc:
            raise ConnectionError(f"the run's permit service is gone: {exc}") from None

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith((b"stop ", b"interrupt ")):
                    kind, _, reason = line.decode().partition(" ")
                    self.stopped, self.interrupted = reason, kind == "interrupt"
                    if self.on_stop is not None:
                        self.on_stop(reason, self.interrupted)
                    continue
                kind, ident, *rest = line.decode().split()
                with self._lock:
                    entry = self._waiting.pop(ident, None)
                    abandoned = self._abandoned.pop(ident, None)
                if entry is None:
                    if kind == "grant" and abandoned is not None:
                        # Granted after its waiter gave up. If the service is gone meanwhile
                        # (a Ctrl-C'd run ending), so is what this connection held.
                        with contextlib.suppress(ConnectionError):
                            self.release(abandoned)
                    continue
                loop, future, key = entry
                value = float(rest[0]) if rest else 0.0
                with contextlib.suppress(RuntimeError):  # that loop is closed: its waiter is gone
                    loop.call_soon_threadsafe(self._resolve, future, value, key if kind == "grant" else None)
        with self._lock:
            waiting, self._waiting = self._waiting, {}
            self._closed = True
        for loop, future, _ in waiting.values():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._fail, future)

    def _resolve(self, future: asyncio.Future[float], value: float, granted: str | None) -> None:
        if future.cancelled():
            if granted is not None:
                self.release(granted)  # nobody will use it
        else:
            future.set_result(value)

    @staticmethod
    def _fail(future: asyncio.Future[float]) -> None:
        if not future.done():
            future.set_exception(ConnectionError("the run's permit service is gone (the controller ended)"))
