"""Package registries of our own on loopback, for the real ``npm`` and ``pip`` clients.

:class:`LocalRegistry` serves npm packuments and tarballs (``npm view``,
``npm pack``) and a PEP 503 simple index with wheels (``pip install
--report``, ``pip download``); every request is counted, so a test can say
that a run asked the registry nothing. ``integrity`` / ``sha256`` can be
served wrong on purpose.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

__all__ = ["LocalRegistry", "local_registry", "npm_tarball", "wheel"]


def npm_tarball(files: dict[str, str], modes: dict[str, int] | None = None) -> bytes:
    """An npm package tarball: ``files`` (path -> text) under ``package/``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            entry = tarfile.TarInfo(f"package/{name}")
            entry.size, entry.mode = len(data), (modes or {}).get(name, 0o644)
            archive.addfile(entry, io.BytesIO(data))
    return out.getvalue()


def wheel(name: str, version: str, module: str = "") -> tuple[str, bytes]:
    """A pure-Python wheel: (file name, bytes)."""
    dist = name.replace("-", "_")
    files = {
        f"{dist}/__init__.py": module or "VALUE = 1\n",
        f"{dist}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}-{version}.dist-info/RECORD,,\n"
    files[f"{dist}-{version}.dist-info/RECORD"] = record
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return f"{dist}-{version}-py3-none-any.whl", out.getvalue()


@dataclass
class LocalRegistry:
    npm: dict[str, dict[str, bytes]] = field(default_factory=dict)  # name -> version -> tarball
    wheels: dict[str, dict[str, bytes]] = field(default_factory=dict)  # project -> file name -> bytes
    #: Serve this integrity (npm) / sha256 (pip) instead of the true one, by file name.
    wrong_hash: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    url: str = ""
    #: Hold each npm package's metadata until this many different packages are asked for at once
    #: (clients that fetch one after the other never get there: each goes on after a 60 s backstop).
    meet: int = 0
    #: Whether ``meet`` packages were asked for at once (once met, nothing is held any more).
    met: bool = False
    _waiting: set[str] = field(default_factory=set)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def _gather(self, name: str) -> None:
        with self._changed:
            self._waiting.add(name)
            self.met = self.met or len(self._waiting) >= self.meet
            self._changed.notify_all()
            try:
                self._changed.wait_for(lambda: self.met, timeout=60)
            finally:
                self._waiting.discard(name)

    def add_npm(self, name: str, version: str, tarball: bytes) -> None:
        self.npm.setdefault(name, {})[version] = tarball

    def add_wheel(self, project: str, file_name: str, data: bytes) -> None:
        self.wheels.setdefault(project, {})[file_name] = data

    @property
    def npm_url(self) -> str:
        return self.url + "/npm/"

    @property
    def pip_url(self) -> str:
        return self.url + "/simple/"

    def _packument(self, name: str) -> dict[str, object]:
        versions = {}
        for version, data in self.npm[name].items():
            file_name = f"{name.split('/')[-1]}-{version}.tgz"
            digest = hashlib.sha512(b"tampered" if file_name in self.wrong_hash else data).digest()
            versions[version] = {
                "name": name,
                "version": version,
                "dist": {
                    "tarball": f"{self.npm_url}{name}/-/{file_name}",
                    "integrity": "sha512-" + base64.b64encode(digest).decode(),
                    "shasum": hashlib.sha1(data).hexdigest(),
                },
            }
        latest = sorted(versions)[-1]
        return {"name": name, "dist-tags": {"latest": latest}, "versions": versions}

    def _simple(self, project: str) -> bytes:
        links = []
        for file_name, data in self.wheels[project].items():
            digest = hashlib.sha256(b"tampered" if file_name in self.wrong_hash else data).hexdigest()
            links.append(f'<a href="{self.url}/files/{file_name}#sha256={digest}">{file_name}</a>')
        return f"<html><body>{''.join(links)}</body></html>".encode()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        self.requests.append(path)
        path = unquote(path)
        if path.startswith("/npm/"):
            rest = path.removeprefix("/npm/")
            if "/-/" in rest:
                name, _, file_name = rest.partition("/-/")
                for version, data in self.npm.get(name, {}).items():
                    if file_name == f"{name.split('/')[-1]}-{version}.tgz":
                        return 200, "application/octet-stream", data
                return 404, "application/json", b"{}"
            if rest in self.npm:
                if self.meet:
                    self._gather(rest)
                return 200, "application/json", json.dumps(self._packument(rest)).encode()
            return 404, "application/json", b'{"error": "Not found"}'
        if path.startswith("/simple/"):
            project = path.removeprefix("/simple/").strip("/").lower().replace("_", "-")
            if project in self.wheels:
                return 200, "text/html", self._simple(project)
            return 404, "text/html", b"not found"
        if path.startswith("/files/"):
            file_name = path.removeprefix("/files/")
            for files in self.wheels.values():
                if file_name in files:
                    return 200, "application/octet-stream", files[file_name]
        return 404, "text/plain", b"not found"


@contextmanager
def local_registry() -> Iterator[LocalRegistry]:
    registry = LocalRegistry()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, kind, body = registry.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    registry.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
