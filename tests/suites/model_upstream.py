"""A scripted model server on loopback that speaks the four model APIs, streaming too.

Tests (and the agent-harness tests) start it on 127.0.0.1 with an ephemeral
port. It answers from a script of protocol-neutral :class:`Turn` objects
(text, tool calls with a name and JSON arguments, an HTTP error, garbage, a
delay, a stall mid-stream), rendered in whichever API the request used:

==================  =======================================================
OpenAI chat         ``POST /v1/chat/completions`` (SSE with ``stream: true``;
                    a usage chunk only when ``stream_options.include_usage``)
OpenAI Responses    ``POST /v1/responses`` (SSE events as the API streams them)
Anthropic Messages  ``POST /v1/messages`` (SSE with ``stream: true``)
Gemini              ``POST /v1beta/models/M:generateContent`` and
                    ``:streamGenerateContent`` (``?alt=sse``, else a JSON array);
                    ``/v1/`` and ``/v1alpha/`` too
==================  =======================================================

Base URLs for clients: :attr:`ScriptedServer.base_url` (OpenAI, ends in
``/v1``) and :attr:`ScriptedServer.root_url` (Anthropic and Gemini, which add
their own version prefix).

When the script runs out, ``responder(seen)`` answers (a :class:`Seen` gives
the protocol, the model, the offered tool names, the conversation text and
how many tool results it holds, whatever the protocol), else
``default(body)`` (the request's JSON body), else "done". Every request is
recorded in :attr:`ScriptedServer.requests` (path, headers, body, protocol,
and the token usage the server reported in its answer, ``None`` if it
reported none), and :meth:`ScriptedServer.reported` sums those counts: what
"usage equals what the server counted" compares with.

The script's vocabulary is ``model_script``, rendering a turn in each API
``model_rendering``; this module is the server.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from model_rendering import error_body, render, reported_counts, stream_events
from model_script import PROTOCOLS, Seen, ToolUse, Turn, garbage, stall, text, tool

__all__ = [
    "PROTOCOLS",
    "ScriptedServer",
    "Seen",
    "ToolUse",
    "Turn",
    "cutting_upstream",
    "garbage",
    "scripted_server",
    "stall",
    "text",
    "tool",
]


def route(method: str, path: str) -> tuple[str, str | None, bool] | None:
    """``(protocol, model from the path, streamed by the path)`` of a request, ``None`` if unknown."""
    if method != "POST":
        return None
    if path == "/v1/chat/completions":
        return "openai_chat", None, False
    if path == "/v1/responses":
        return "openai_responses", None, False
    if path == "/v1/messages":
        return "anthropic", None, False
    for prefix in ("/v1beta/models/", "/v1/models/", "/v1alpha/models/"):
        if path.startswith(prefix) and ":" in path:
            model, _, verb = path[len(prefix) :].partition(":")
            if verb in ("generateContent", "streamGenerateContent"):
                return "gemini", model, verb == "streamGenerateContent"
    return None


def _offered_key(headers: Any, query: Any) -> str | None:
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return str(auth[7:])
    return headers.get("x-api-key") or headers.get("x-goog-api-key") or query.get("key")


class ScriptedServer:
    """The server's state: the script, the responders, and what it saw.

    :param api_key: when set, a request must carry it (``Authorization:
        Bearer``, ``x-api-key``, ``x-goog-api-key`` or ``?key=``), else 401.
    """

    def __init__(
        self,
        default: Callable[[dict[str, Any]], Turn] | None = None,
        *,
        responder: Callable[[Seen], Turn] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.script: deque[Turn] = deque()
        self.default = default
        self.responder = responder
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        #: Requests whose client hung up before their answer ended (held back by a delay or a stall).
        self.aborted = 0
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.port = 0
        self.host = "127.0.0.1"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: Any = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (chat completions and Responses)."""
        return f"{self.root_url}/v1"

    @property
    def root_url(self) -> str:
        """The Anthropic and Gemini base URL (their clients add ``/v1`` or ``/v1beta``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def push(self, *turns: Turn) -> None:
        with self.lock:
            self.script.extend(turns)

    def next_turn(self, seen: Seen) -> Turn:
        with self.lock:
            if self.script:
                return self.script.popleft()
        if self.responder is not None:
            return self.responder(seen)
        if self.default is not None:
            return self.default(seen.body if isinstance(seen.body, dict) else {})
        return text("done")

    def bodies(self) -> list[Any]:
        with self.lock:
            return [r["body"] for r in self.requests]

    def reported(self, protocol: str | None = None) -> dict[str, int]:
        """Token totals the server reported in its answers (of ``protocol`` only, if given)."""
        totals = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        with self.lock:
            for record in self.requests:
                usage = record.get("usage")
                if usage is None or (protocol is not None and record["protocol"] != protocol):
                    continue
                totals["calls"] += 1
                for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
                    totals[key] += usage[key]
        return totals

    def wait_until(self, condition: Callable[[], bool], backstop: float = 60.0) -> None:
        """Block until ``condition()`` holds; ``backstop`` only keeps a broken test from hanging."""
        deadline = time.monotonic() + backstop
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("the server never saw what the test waited for")
            time.sleep(0.01)

    # -- lifecycle ---------------------------------------------------------------
    def start(self, host: str = "127.0.0.1") -> None:
        """Serve on ``host`` (loopback by default) in a thread with its own event loop."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        self.port = sock.getsockname()[1]
        self.host = host
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self._serve(sock, ready))
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                ready.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name="scripted-model-server", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=5)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._stopping = asyncio.Event()
        ready.set()
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass  # its loop already ended
        if self._thread is not None:
            self._thread.join(30)

    # -- requests ----------------------------------------------------------------
    async def _handle(self, request: Any) -> Any:
        try:
            return await self._answer(request)
        except asyncio.CancelledError:
            # The client hung up (aiohttp cancels the handler), wherever the answer was: even
            # before its body was read, when a loaded machine starts the handler late.
            with self.lock:
                self.aborted += 1
            raise

    async def _answer(self, request: Any) -> Any:
        from aiohttp import web

        raw = await request.read()
        try:
            body: Any = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = {"unparsed": raw.decode("utf-8", "replace")}
        found = route(request.method, request.path)
        record: dict[str, Any] = {
            "path": request.path_qs,
            "headers": dict(request.headers),
            "body": body,
            "protocol": found[0] if found else None,
            "usage": None,
        }
        with self.lock:
            self.requests.append(record)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if found is None:
                return web.json_response(error_body("openai_chat", 404, f"no route {request.path}"), status=404)
            protocol, path_model, path_stream = found
            if self.api_key is not None and _offered_key(request.headers, request.query) != self.api_key:
                message = "Incorrect API key provided"
                return web.json_response(error_body(protocol, 401, message, "authentication_error"), status=401)
            data = body if isinstance(body, dict) else {}
            streamed = path_stream if protocol == "gemini" else bool(data.get("stream"))
            model = str(path_model or data.get("model") or "scripted")
            seen = Seen(protocol, request.path_qs, dict(request.headers), body, model, streamed)
            turn = self.next_turn(seen)
            if turn.gate is not None:
                await asyncio.to_thread(turn.gate.wait)
            if turn.delay and not await self._hold(turn.delay):
                return web.Response(status=499)  # nobody reads it: the client is gone
            include_usage = bool((data.get("stream_options") or {}).get("include_usage"))
            usage = reported_counts(protocol, turn, streamed=streamed, include_usage=include_usage)
            headers = {"retry-after-ms": "1", **turn.headers}  # clients must not wait their own backoff in tests
            if turn.body is not None or turn.status >= 400:
                payload = turn.body
                if payload is None:
                    payload = error_body(protocol, turn.status, turn.error or "scripted error", turn.error_type)
                data_out = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                return web.Response(body=data_out, status=turn.status, headers=headers, content_type=turn.content_type)
            if not streamed:
                record["usage"] = usage
                return web.json_response(render(protocol, turn, model), headers=headers)
            sse = protocol != "gemini" or request.query.get("alt") == "sse"
            frames = stream_events(protocol, turn, model, include_usage)
            return await self._stream(request, frames, turn, record, usage, headers, sse)
        finally:
            with self.lock:
                self.in_flight -= 1

    async def _stream(
        self,
        request: Any,
        frames: list[bytes],
        turn: Turn,
        record: dict[str, Any],
        usage: dict[str, int] | None,
        headers: dict[str, str],
        sse: bool,
    ) -> Any:
        from aiohttp import web

        response = web.StreamResponse(headers=headers)
        response.content_type = "text/event-stream" if sse else "application/json"
        await response.prepare(request)
        if not sse:  # Gemini without alt=sse: one JSON array, written element by element
            chunks = [f.decode().removeprefix("data: ").strip() for f in frames]
            frames = [("[" if i == 0 else ",").encode() + c.encode() for i, c in enumerate(chunks)] + [b"]"]
        for index, frame in enumerate(frames):
            await response.write(frame)
            if turn.stall and index == 0:
                await self._hold(None)
                return response
        record["usage"] = usage
        if turn.linger:
            await self._hold(None)
            return response
        await response.write_eof()
        return response

    async def _hold(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (``None``: until the server stops); False when the server stops first.

        A client that hangs up meanwhile cancels the wait (counted in ``aborted``).
        """
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return True
        return False


@contextmanager
def scripted_server(
    default: Callable[[dict[str, Any]], Turn] | None = None,
    *,
    responder: Callable[[Seen], Turn] | None = None,
    api_key: str | None = None,
    host: str = "127.0.0.1",
) -> Iterator[ScriptedServer]:
    server = ScriptedServer(default, responder=responder, api_key=api_key)
    server.start(host)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def cutting_upstream(answer: bytes) -> Iterator[str]:
    """A loopback HTTP server that reads each request, sends ``answer`` (headers and the start of a
    body that promises more) and closes the connection; yields its OpenAI base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(
                    next(
                        (h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")),
                        b"0",
                    )
                )
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        done.set()
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        thread.join(10)
