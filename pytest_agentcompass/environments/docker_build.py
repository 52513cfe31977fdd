"""One image build through the engine's HTTP API, run in a worker thread, that can be stopped.

The SDK's ``build()`` hides its HTTP response; posting ourselves keeps a handle
on the connection, which is how a timed-out build is stopped in the engine
and not only here (see :meth:`BuildJob.abort`).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..vocabulary.artifacts import TextFile
from .docker_bases import has_image, rewrite_bases

__all__ = ["LOG_TAIL_LINES", "REWRITTEN", "BuildJob", "BuildSpec"]

#: The name a Dockerfile with rewritten ``FROM`` lines gets in the build context.
REWRITTEN = ".agentcompass.Dockerfile"
#: Lines of the build log quoted in the error of a failed build.
LOG_TAIL_LINES = 25
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: A build error of the Dockerfile's own making (classic builder wording): a step that
#: exits non-zero, a COPY/ADD source that is not there, a line it cannot parse.
_STEP_FAILED = re.compile(
    r"returned a non-zero code|^(COPY|ADD) failed|dockerfile parse error|unknown instruction", re.IGNORECASE
)
_STEP_CONTAINER = re.compile(r"^\s*---> Running in ([0-9a-f]{12,64})\s*$")


@dataclass(frozen=True)
class BuildSpec:
    """One image to build: ``dockerfile`` (relative to ``context``) within ``timeout`` seconds."""

    context: str
    dockerfile: str = "Dockerfile"
    timeout: float | None = None

    @classmethod
    def from_params(cls, value: Mapping[str, Any]) -> BuildSpec:
        timeout = value.get("timeout")
        return cls(
            context=str(value["context"]),
            dockerfile=str(value.get("dockerfile") or "Dockerfile"),
            timeout=float(timeout) if timeout else None,
        )


class BuildJob:
    """One blocking build, run in a worker thread; :meth:`abort` closes its stream."""

    def __init__(self, client: Any, spec: BuildSpec, tag: str, log: TextFile | None) -> None:
        self.client = client
        self.spec = spec
        self.tag = tag
        #: The build log (in the run directory, written through its store), if there is one.
        self.log = log
        self.lines: list[str] = []
        self.error: str | None = None
        #: The error is the task's: its Dockerfile does not parse, a step of it fails, a file it copies is missing.
        self.task_fault = False
        self._response: Any = None
        #: Containers the classic builder said it runs steps in ("---> Running in <id>").
        self.step_containers: list[str] = []
        self._lock = threading.Lock()
        self._aborted = False

    def where(self) -> str:
        return f" (build log: {self.log.path})" if self.log else ""

    def tail(self) -> str:
        return "".join(self.lines[-LOG_TAIL_LINES:]).rstrip()

    def abort(self) -> None:
        """Stop the build in the engine, not only here (blocking: run it in a thread).

        Closing the response alone does not wake the thread blocked reading it,
        so the build would run on to its end: the socket is shut down instead,
        which both wakes the reader and tells the engine its client went away
        (the classic builder then cancels the step and removes its container).
        The containers of steps the log named are removed too, in case the
        engine is slower to notice than we are to return.
        """
        with self._lock:
            self._aborted = True
            response = self._response
        if response is not None:
            _shut_down(self.client.api, response)
        for container in self.step_containers:
            with contextlib.suppress(Exception):  # gone already: what we want
                self.client.api.remove_container(container, force=True)

    def run(self) -> None:
        from docker.utils.build import tar

        api = self.client.api
        context = self.spec.context
        ignore = Path(context, ".dockerignore")
        exclude = [
            line.strip() for line in (ignore.read_text().splitlines() if ignore.is_file() else []) if line.strip()
        ]
        try:
            original = Path(context, self.spec.dockerfile).read_text(encoding="utf-8", errors="replace")
            rewritten, notes = rewrite_bases(self.client, original)
            for note in notes:
                self._log(f"agentcompass: {note}\n")
            # A rewritten Dockerfile travels beside the context's own files, under a name of its own.
            dockerfile = (REWRITTEN, rewritten) if notes else (self.spec.dockerfile, None)
            with tar(context, exclude=exclude, dockerfile=dockerfile) as payload:
                # The SDK's build() hides its HTTP response; posting ourselves keeps
                # a handle to close, which is how a timed-out build is stopped.
                response = api._post(
                    api._url("/build"),
                    data=payload,
                    params={"t": self.tag, "dockerfile": dockerfile[0], "rm": True, "forcerm": True},
                    headers={"Content-Type": "application/tar"},
                    stream=True,
                    timeout=None,
                )
                with self._lock:
                    self._response = response
                    aborted = self._aborted
                if aborted:  # timed out while the context was uploading
                    _shut_down(api, response)
                    return
                if response.status_code >= 400:
                    # 4xx: the request (the Dockerfile) is wrong; 5xx: the engine failed.
                    self.task_fault = response.status_code < 500
                    self.error = f"the engine refused the build: {response.text.strip()}"
                    self._log(self.error + "\n")
                    return
                for chunk in api._stream_helper(response, decode=True):
                    text = chunk.get("stream") or chunk.get("status") or ""
                    if "error" in chunk:
                        self.error = str(chunk.get("error", "")).strip()
                        self.task_fault = bool(_STEP_FAILED.search(self.error))
                        text = f"ERROR: {self.error}\n"
                    if text:
                        self._log(text)
                        step = _STEP_CONTAINER.match(text)
                        if step:
                            self.step_containers.append(step.group(1))
        except Exception as exc:
            if not self._aborted:
                self.error = f"{type(exc).__name__}: {exc}"
                self._log(f"ERROR: {self.error}\n")
        finally:
            if self._response is not None:
                self._response.close()
        if self.error is None and not self._aborted and not has_image(self.client, self.tag):
            self.error = "the build ended without producing the image"

    def _log(self, text: str) -> None:
        # The log file keeps what the engine sent; the tail quoted in errors loses
        # the terminal's colour codes and carriage returns.
        self.lines.append(_TERMINAL_CODES.sub("", text).replace("\r\n", "\n").replace("\r", "\n"))
        if len(self.lines) > 4 * LOG_TAIL_LINES:
            del self.lines[:-LOG_TAIL_LINES]
        if self.log is not None:
            self.log.write(text)


def _shut_down(api: Any, response: Any) -> None:
    """End ``response``'s connection both ways (see :meth:`BuildJob.abort`)."""
    with contextlib.suppress(Exception):
        sock = api._get_raw_response_socket(response)
        getattr(sock, "_sock", sock).shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()
