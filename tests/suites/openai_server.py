"""A real OpenAI-compatible HTTP server on loopback, answering from a script.

Tests hand it replies in order (text, tool calls, HTTP errors, slow answers);
when the script runs out, a ``default`` function of the request answers.
Every request is recorded (path, headers, parsed body) for assertions.
The server speaks plain HTTP/1.1 on 127.0.0.1 with an ephemeral port.
"""

from __future__ import annotations

import itertools
import json
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Reply", "ScriptedServer", "answer", "error", "garbage", "scripted_server", "slow", "tool_call"]


@dataclass
class Reply:
    """One scripted answer: a status, a JSON body (or ``raw`` bytes), and how long to hold it back."""

    status: int = 200
    body: Any = field(default_factory=dict)
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    content_type: str = "application/json"


_ids = itertools.count(1)


def _completion(message: dict[str, Any], finish: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def answer(text: str, *, prompt_tokens: int = 10, completion_tokens: int = 5, delay: float = 0.0) -> Reply:
    """An assistant message without tool calls."""
    message = {"role": "assistant", "content": text}
    return Reply(body=_completion(message, "stop", prompt_tokens, completion_tokens), delay=delay)


def tool_call(
    command: str | None = None,
    *,
    arguments: str | None = None,
    name: str = "shell",
    content: str | None = None,
    prompt_tokens: int = 20,
    completion_tokens: int = 8,
) -> Reply:
    """An assistant message with one tool call; ``arguments`` overrides the JSON (to send malformed ones)."""
    args = arguments if arguments is not None else json.dumps({"command": command})
    call = {"id": f"call_{next(_ids)}", "type": "function", "function": {"name": name, "arguments": args}}
    message = {"role": "assistant", "content": content, "tool_calls": [call]}
    return Reply(body=_completion(message, "tool_calls", prompt_tokens, completion_tokens))


def error(status: int, message: str = "scripted error", kind: str = "server_error") -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": kind, "code": None}})


def garbage(raw: bytes | str, content_type: str = "application/json") -> Reply:
    """A 200 answer whose body is ``raw`` as it is: not JSON, or not a chat completion."""
    return Reply(raw=raw.encode() if isinstance(raw, str) else raw, content_type=content_type)


def slow(seconds: float, then: Reply | None = None) -> Reply:
    """``then`` (an answer by default), held back ``seconds`` or until the client hangs up."""
    reply = then or answer("late")
    return Reply(status=reply.status, body=reply.body, delay=seconds, headers=reply.headers, raw=reply.raw)


class ScriptedServer:
    """The server's state: the script, the default, and what it saw."""

    def __init__(self, default: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.script: deque[Reply] = deque()
        self.default = default or (lambda body: answer("done"))
        self.requests: list[dict[str, Any]] = []
        #: Requests whose client hung up while the server held the answer back.
        self.aborted = 0
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def push(self, *replies: Reply) -> None:
        with self.lock:
            self.script.extend(replies)

    def next_reply(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            if self.script:
                return self.script.popleft()
        return self.default(body)

    def start(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # One segment per answer and no Nagle delay: otherwise every call waits for a delayed ACK (~40 ms).
            wbufsize = 64 * 1024
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"unparsed": raw.decode("utf-8", "replace")}
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    server.in_flight += 1
                    server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
                try:
                    reply = server.next_reply(body)
                    if reply.delay and not self._hold(reply.delay):
                        with server.lock:
                            server.aborted += 1
                        return
                    data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(data)))
                    # The client must not retry on its own schedule header: tests count requests.
                    self.send_header("retry-after-ms", "1")
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _hold(self, seconds: float) -> bool:
                """Wait ``seconds``; False as soon as the client closed the connection."""
                waited = 0.0
                while waited < seconds and not server._stop.is_set():
                    readable, _, _ = select.select([self.connection], [], [], 0.02)
                    if readable and not self.connection.recv(1, 0x2):  # MSG_PEEK: b"" is a hang-up
                        return False
                    waited += 0.02
                return not server._stop.is_set()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def wait_until(self, condition: Callable[[], bool], backstop: float = 60.0) -> None:
        """Block until ``condition()`` holds; ``backstop`` only keeps a broken test from hanging."""
        deadline = time.monotonic() + backstop
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("the server never saw what the test waited for")
            time.sleep(0.01)

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r["body"] for r in self.requests]


@contextmanager
def scripted_server(default: Callable[[dict[str, Any]], Reply] | None = None) -> Iterator[ScriptedServer]:
    server = ScriptedServer(default)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def load_client_modules() -> None:
    """Exercise the ``openai`` client once (answer, error, timeout, refused connection).

    pytester's in-process runs remove every module first imported inside
    them; the client imports parts of its HTTP stack lazily, and a second,
    fresh copy of those parts no longer matches the exception classes the
    first copy raises. Importing them here, at collection, keeps one copy.
    """
    import asyncio

    import openai

    async def calls(url: str, server: ScriptedServer | None) -> None:
        for reply, timeout in ((answer("ok"), 5.0), (error(500), 5.0), (slow(5), 0.05)):
            if server is not None:
                server.push(reply)
            client = openai.AsyncOpenAI(api_key="warm-up", base_url=url, max_retries=0, timeout=timeout)
            try:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            except openai.OpenAIError:
                pass
            finally:
                await client.close()

    with scripted_server() as server:
        url = server.base_url
        asyncio.run(calls(url, server))
    asyncio.run(calls(url, None))  # the server is gone: refused connections


try:
    load_client_modules()
except ImportError:
    pass  # no openai: the tests that need it skip themselves
