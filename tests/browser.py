"""Headless Debian ``chromium`` for the HTML report tests and the first-paint measurement.

Two ways in: :func:`dump_dom` (``--dump-dom``: the DOM after load, with
virtual time so that chunked rendering completes) and :class:`Browser`, a
small DevTools-protocol client over a plain-socket websocket, to type into
the page and read timings. Nothing is downloaded: the browser is the system's.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: Every switch that keeps a headless run hermetic: no network, no updates, no sync, no GPU.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # A headless page counts as hidden: without these its timers run once a
    # second, which no visible tab does (chunked rendering would crawl).
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]


def find_chromium() -> str | None:
    """``$AGENTCOMPASS_CHROMIUM`` when set, else ``chromium`` on the PATH."""
    chosen = os.environ.get("AGENTCOMPASS_CHROMIUM")
    if chosen:
        return shutil.which(chosen)
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> str:
    """The browser, or skip (locally) / fail (in CI, where ``.ci/run`` installs it)."""
    found = find_chromium()
    if found is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("chromium is not installed: CI must run the browser tests (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return found


def _env(profile: str) -> dict[str, str]:
    # Chromium puts its singleton socket in a folder of its own under TMPDIR
    # (org.chromium.Chromium.*) and leaves it there when terminated: inside
    # the profile, it goes with the profile.
    return {**os.environ, "TMPDIR": profile}


def dump_dom(chromium: str, url: str, *, virtual_time_ms: int = 10_000) -> str:
    with tempfile.TemporaryDirectory(prefix="agentcompass-chromium-") as profile:
        done = subprocess.run(
            [
                chromium,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={virtual_time_ms}",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            env=_env(profile),
            text=True,
            timeout=120,
            check=False,
        )
    if done.returncode != 0 or not done.stdout:
        raise RuntimeError(f"chromium --dump-dom failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


class Browser:
    """One headless chromium with one page, driven over the DevTools protocol."""

    def __init__(self, chromium: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="agentcompass-chromium-")
        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={self._profile.name}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=_env(self._profile.name),
            text=True,
        )
        self._drain: threading.Thread | None = None
        try:
            port = self._port()
            # Chromium keeps logging to stderr: read it all, or a full pipe would stall it.
            self._drain = threading.Thread(target=self._discard, daemon=True)
            self._drain.start()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as response:
                targets = json.load(response)
            page = next(t for t in targets if t.get("type") == "page")
            self.ws = _WebSocket(page["webSocketDebuggerUrl"])
        except BaseException:
            self.close()
            raise
        self._id = 0
        self.events: list[dict[str, Any]] = []

    def _port(self) -> int:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found.group(1))
        raise RuntimeError("chromium exited before it listened for DevTools")

    def _discard(self) -> None:
        assert self.proc.stderr is not None
        for _ in self.proc.stderr:
            pass

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.events.append(message)

    def wait_event(self, method: str) -> dict[str, Any]:
        for index, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(index)
        while True:
            message = json.loads(self.ws.recv())
            if message.get("method") == method:
                return message
            self.events.append(message)

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._drain is not None:
            self._drain.join()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self._profile.cleanup()


@contextlib.contextmanager
def browser(chromium: str) -> Iterator[Browser]:
    instance = Browser(chromium)
    try:
        yield instance
    finally:
        instance.close()


class _WebSocket:
    """The client side of RFC 6455, text frames only: enough for the DevTools protocol."""

    def __init__(self, url: str) -> None:
        found = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        if not found:
            raise ValueError(f"unexpected DevTools url {url}")
        host, port, path = found.group(1), int(found.group(2)), found.group(3)
        self.sock = socket.create_connection((host, port), timeout=120)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise RuntimeError("DevTools closed the connection during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"websocket handshake refused: {head!r}")

    def send(self, text: str) -> None:
        data = text.encode()
        header = bytearray([0x81])
        if len(data) < 126:
            header.append(0x80 | len(data))
        elif len(data) < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(data))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(data))
        mask = os.urandom(4)
        self.sock.sendall(bytes(header) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise RuntimeError("DevTools closed the connection")
            out += chunk
        return out

    def recv(self) -> str:
        parts: list[bytes] = []
        while True:
            first, second = self._exact(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(length)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise RuntimeError("DevTools closed the websocket")
            if opcode in (0x9, 0xA):
                continue  # ping/pong
            parts.append(payload)
            if first & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        self.sock.close()


def file_url(path: Path, fragment: str = "") -> str:
    return path.resolve().as_uri() + (f"#{fragment}" if fragment else "")
