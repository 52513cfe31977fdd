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
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PROTOCOLS",
    "ScriptedServer",
    "Seen",
    "ToolUse",
    "Turn",
    "garbage",
    "scripted_server",
    "stall",
    "text",
    "tool",
]

PROTOCOLS = ("openai_chat", "openai_responses", "anthropic", "gemini")
_ids = itertools.count(1)


@dataclass
class ToolUse:
    """One tool call: ``arguments`` is a JSON value, or a string sent as it is (to send malformed JSON)."""

    name: str
    arguments: Any = field(default_factory=dict)

    def json_text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)

    def json_value(self) -> Any:
        if not isinstance(self.arguments, str):
            return self.arguments
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return {"unparsed": self.arguments}


@dataclass
class Turn:
    """One scripted answer, rendered in the request's protocol.

    ``status >= 400`` answers the protocol's error body with ``error`` as its
    message; ``body`` (bytes or a JSON value) is sent as it is instead of
    anything rendered (garbage, or a protocol's own raw JSON). ``delay`` holds
    the answer back (a client hang-up meanwhile counts in ``aborted``);
    ``stall`` streams the first event, then holds until the client hangs up;
    ``gate`` holds the answer until the test sets it.
    """

    text: str | None = None
    tool_calls: list[ToolUse] = field(default_factory=list)
    status: int = 200
    error: str | None = None
    error_type: str = "server_error"
    body: Any = None
    content_type: str = "application/json"
    delay: float = 0.0
    stall: bool = False
    #: Held until this event is set (then answered), for tests that need calls in flight at once.
    gate: threading.Event | None = None
    prompt_tokens: int = 10
    completion_tokens: int = 5
    headers: dict[str, str] = field(default_factory=dict)


def text(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5, delay: float = 0.0) -> Turn:
    """An assistant answer without tool calls."""
    return Turn(text=content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, delay=delay)


def tool(name: str, arguments: Any = None, *, content: str | None = None, **counts: int) -> Turn:
    """An assistant turn with one tool call (``arguments``: a JSON value, or raw text)."""
    return Turn(text=content, tool_calls=[ToolUse(name, {} if arguments is None else arguments)], **counts)


def garbage(data: bytes = b"<html>502 Bad Gateway</html>", status: int = 502) -> Turn:
    """A body that is no protocol's JSON."""
    return Turn(status=status, body=data, content_type="text/html")


def stall(then: Turn | None = None) -> Turn:
    """A streamed answer that stops after its first event and holds until the client hangs up."""
    turn = then or text("never finished")
    turn.stall = True
    return turn


@dataclass
class Seen:
    """A request as a responder sees it, whatever its protocol."""

    protocol: str
    path: str
    headers: dict[str, str]
    body: Any
    model: str | None
    stream: bool

    def tools(self) -> list[str]:
        """The names of the tools the request offers."""
        names: list[str] = []
        for entry in self.body.get("tools") or [] if isinstance(self.body, dict) else []:
            if not isinstance(entry, dict):
                continue
            if self.protocol == "gemini":
                names.extend(d.get("name", "") for d in entry.get("functionDeclarations") or [])
            elif isinstance(entry.get("function"), dict):  # chat completions
                names.append(entry["function"].get("name", ""))
            elif "name" in entry:  # Responses, Anthropic
                names.append(entry["name"])
        return names

    def tool_results(self) -> int:
        """How many tool results the conversation holds."""
        return sum(1 for kind in _walk_kinds(self.body) if kind in _RESULT_KINDS)

    def text(self) -> str:
        """Every string of the request body, joined (to find a task's instruction)."""
        return "\n".join(_strings(self.body))


_RESULT_KINDS = {"role:tool", "type:function_call_output", "type:tool_result", "key:functionResponse"}


def _walk_kinds(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if value.get("role") == "tool":
            yield "role:tool"
        if isinstance(value.get("type"), str):
            yield f"type:{value['type']}"
        if "functionResponse" in value:
            yield "key:functionResponse"
        for item in value.values():
            yield from _walk_kinds(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk_kinds(item)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# -- rendering ---------------------------------------------------------------------
def _usage(protocol: str, turn: Turn) -> dict[str, int]:
    p, c = turn.prompt_tokens, turn.completion_tokens
    if protocol == "openai_chat":
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if protocol == "openai_responses":
        return {
            "input_tokens": p,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c,
        }
    if protocol == "anthropic":
        return {"input_tokens": p, "output_tokens": c}
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c}


def error_body(protocol: str, status: int, message: str, kind: str = "server_error") -> dict[str, Any]:
    """The error body each API sends with an HTTP error status."""
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    if protocol == "gemini":
        return {"error": {"code": status, "message": message, "status": kind.upper()}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _chat_message(turn: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{next(_ids)}", "type": "function", "function": {"name": t.name, "arguments": t.json_text()}}
            for t in turn.tool_calls
        ]
    return message


def _responses_items(turn: Turn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if turn.text is not None:
        items.append(
            {
                "type": "message",
                "id": f"msg_{next(_ids)}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": turn.text, "annotations": [], "logprobs": []}],
            }
        )
    for call in turn.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{next(_ids)}",
                "call_id": f"call_{next(_ids)}",
                "name": call.name,
                "arguments": call.json_text(),
                "status": "completed",
            }
        )
    return items


def _response_object(model: str, status: str, output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": f"resp_{next(_ids)}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "usage": usage,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
    }


def _anthropic_blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.text is not None:
        blocks.append({"type": "text", "text": turn.text})
    for call in turn.tool_calls:
        blocks.append({"type": "tool_use", "id": f"toolu_{next(_ids)}", "name": call.name, "input": call.json_value()})
    return blocks


def _gemini_parts(turn: Turn) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if turn.text is not None:
        parts.append({"text": turn.text})
    parts.extend({"functionCall": {"name": c.name, "args": c.json_value()}} for c in turn.tool_calls)
    return parts


def render(protocol: str, turn: Turn, model: str) -> dict[str, Any]:
    """The non-streamed answer of ``turn``."""
    usage = _usage(protocol, turn)
    if protocol == "openai_chat":
        return {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": _chat_message(turn),
                    "finish_reason": "tool_calls" if turn.tool_calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    if protocol == "openai_responses":
        return _response_object(model, "completed", _responses_items(turn), usage)
    if protocol == "anthropic":
        return {
            "id": f"msg_{next(_ids)}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _anthropic_blocks(turn),
            "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
    return {
        "candidates": [
            {"content": {"role": "model", "parts": _gemini_parts(turn)}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": f"gem-{next(_ids)}",
    }


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def stream_events(protocol: str, turn: Turn, model: str, include_usage: bool) -> list[bytes]:
    """The streamed answer of ``turn``: SSE frames in the order the API sends them."""
    if protocol == "openai_chat":
        return _chat_stream(turn, model, include_usage)
    if protocol == "openai_responses":
        return _responses_stream(turn, model)
    if protocol == "anthropic":
        return _anthropic_stream(turn, model)
    return _gemini_stream(turn, model)


def _chat_stream(turn: Turn, model: str, include_usage: bool) -> list[bytes]:
    base = {"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    frames = [chunk({"role": "assistant", "content": ""})]
    if turn.text:
        half = len(turn.text) // 2
        frames += [chunk({"content": turn.text[:half]}), chunk({"content": turn.text[half:]})]
    for index, call in enumerate(turn.tool_calls):
        args = call.json_text()
        head = {"index": index, "id": f"call_{next(_ids)}", "type": "function"}
        frames.append(chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}))
        for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
            frames.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    frames.append(chunk({}, "tool_calls" if turn.tool_calls else "stop"))
    if include_usage:
        frames.append(_sse({**base, "choices": [], "usage": _usage("openai_chat", turn)}))
    frames.append(_sse("[DONE]"))
    return frames


def _responses_stream(turn: Turn, model: str) -> list[bytes]:
    seq = itertools.count()
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append(_sse({"type": kind, "sequence_number": next(seq), **fields}, kind))

    final = _response_object(model, "completed", _responses_items(turn), _usage("openai_responses", turn))
    start = {**final, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            opening = {**item, "status": "in_progress", "content": []}
            emit("response.output_item.added", output_index=index, item=opening)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            emit("response.content_part.added", **ids, part=part)
            full = item["content"][0]["text"]
            for piece in (full[: len(full) // 2], full[len(full) // 2 :]):
                emit("response.output_text.delta", **ids, delta=piece, logprobs=[])
            emit("response.output_text.done", **ids, text=full, logprobs=[])
            emit("response.content_part.done", **ids, part={**part, "text": full})
        else:
            opening = {**item, "status": "in_progress", "arguments": ""}
            emit("response.output_item.added", output_index=index, item=opening)
            args = item["arguments"]
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
            emit("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=args)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response={**final, "created_at": start["created_at"], "id": start["id"]})
    return frames


def _anthropic_stream(turn: Turn, model: str) -> list[bytes]:
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append(_sse({"type": kind, **fields}, kind))

    message = render("anthropic", turn, model)
    usage = {"input_tokens": turn.prompt_tokens, "output_tokens": 1}
    start = {**message, "content": [], "stop_reason": None, "usage": usage}
    emit("message_start", message=start)
    emit("ping")
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            full = block["text"]
            for piece in (full[: len(full) // 2], full[len(full) // 2 :]):
                emit("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
        else:
            emit("content_block_start", index=index, content_block={**block, "input": {}})
            args = json.dumps(block["input"])
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                emit("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece})
        emit("content_block_stop", index=index)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    emit("message_delta", delta=delta, usage={"output_tokens": turn.completion_tokens})
    emit("message_stop")
    return frames


def _gemini_stream(turn: Turn, model: str) -> list[bytes]:
    parts = _gemini_parts(turn) or [{"text": ""}]
    frames = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        # Every chunk carries the usage so far (the last one the totals), as the API sends it.
        done = turn.completion_tokens if last else min(index + 1, turn.completion_tokens)
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        if last:
            candidate["finishReason"] = "STOP"
        usage = {"promptTokenCount": turn.prompt_tokens, "candidatesTokenCount": done}
        usage["totalTokenCount"] = turn.prompt_tokens + done
        frames.append(_sse({"candidates": [candidate], "usageMetadata": usage, "modelVersion": model}))
    return frames


def reported_counts(protocol: str, turn: Turn, *, streamed: bool, include_usage: bool) -> dict[str, int] | None:
    """What the answer of ``turn`` told the client it used (``None``: no usage was sent)."""
    if turn.status >= 400 or turn.body is not None:
        return None
    if protocol == "openai_chat" and streamed and not include_usage:
        return None
    p, c = turn.prompt_tokens, turn.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


# -- the server ----------------------------------------------------------------------
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
