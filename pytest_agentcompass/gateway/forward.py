"""Forwarding one request of an agent to its upstream, and recording it in the agent's grant."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from typing import Any
from urllib.parse import urlencode

from ..concurrency.limits import capacity_for
from ..models.ledger import ModelCall, Protocol
from .grant import Grant
from .masking import SecretMask
from .protocols import Route, error_body, prepare_body, response_headers, upstream_headers
from .reading import AnswerReader, SSEParser, error_message
from .settings import GatewaySettings, Upstream

__all__ = ["error_response", "forward"]


async def forward(
    request: Any,
    route: Route,
    grant: Grant,
    upstream: Upstream,
    *,
    model: str,
    settings: GatewaySettings,
    client: Any,
    secrets: tuple[str, ...] = (),
) -> Any:
    """Send ``request`` upstream with the real key and the answer back as it arrives; record the call.

    The model is pinned to ``model`` unless ``settings.allow_other_models``; a
    spent budget answers 403 without calling upstream.
    """
    import aiohttp
    from aiohttp import web
    from yarl import URL

    protocol = route.protocol
    raw = await request.read()
    encoding = request.headers.get("Content-Encoding", "identity").lower()
    if encoding in ("gzip", "deflate"):
        try:
            raw = zlib.decompress(raw, zlib.MAX_WBITS | 32)
        except zlib.error as exc:
            message = f"the {encoding} request body is corrupt: {exc}"
            return error_response(web, protocol, 400, message, "invalid_request_error")
    elif encoding != "identity":
        message = f"request Content-Encoding {encoding!r} is not supported"
        return error_response(web, protocol, 415, message, "invalid_request_error")
    try:
        body: Any = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    generate = route.kind == "generate"
    if generate:
        spent = grant.ledger.spent()
        if spent is not None:
            grant.ledger.refused += 1
            refused = ModelCall(protocol, model, status=403, error=spent, sent=False, extra={"refused": "token_budget"})
            grant.record(refused)
            message = f"{spent}; the model gateway refuses further calls"
            refusal = error_response(web, protocol, 403, message, "budget_exceeded")
            refusal.headers["x-should-retry"] = "false"
            return refusal
    sent, asked = prepare_body(protocol, body, model, settings.allow_other_models)
    asked = asked or route.path_model
    path = request.rel_url.raw_path
    if not settings.allow_other_models:
        path = route.with_model(path, model)
    query = [(k, v) for k, v in request.query.items() if k != "key"]
    url = upstream.url(path) + (f"?{urlencode(query)}" if query else "")
    data = raw if sent is body else json.dumps(sent).encode()
    headers = upstream_headers(request.headers, protocol, upstream.api_key or "", settings.headers)
    streamed = route.path_stream or (isinstance(body, dict) and bool(body.get("stream")))
    # Not sent until the permit is held: an agent may hang up while it waits.
    call = ModelCall(protocol, model, status=None, stream=streamed, sent=False, request=_kept(raw, body, settings))
    call.extra["path"] = request.path
    if asked and asked != model:
        call.extra["requested_model"] = asked
    reader = AnswerReader(protocol)
    mask = SecretMask(
        (upstream.api_key, *settings.headers.values(), *secrets)
    )  # an upstream may quote what it was sent
    got = _Received()
    answer: Any = None
    started = time.perf_counter()
    try:
        async with capacity_for(f"model:{upstream.endpoint}", settings.max_connections).permit():
            started = time.perf_counter()
            call.sent = True
            async with client.request(
                request.method,
                URL(url, encoded=True),
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=settings.timeout, sock_connect=30),
            ) as reply:
                call.status = reply.status
                got.content = reply.content
                out = {name: mask.header(value) for name, value in response_headers(reply.headers).items()}
                if reply.content_type == "text/event-stream" or (route.path_stream and reply.status < 400):
                    answer = web.StreamResponse(status=reply.status, headers=out)
                    await answer.prepare(request)
                    await _pipe(reply, answer, reader, mask, got, sse=reply.content_type == "text/event-stream")
                else:
                    payload = mask.data(await reply.read())
                    _read_body(reader, payload)
                    if reply.status >= 400:
                        call.error = error_message(payload)
                    call.response = _kept(payload, _json(payload), settings)
                    answer = web.Response(body=payload, status=reply.status, headers=out)
        return answer
    except (aiohttp.ClientError, TimeoutError) as exc:
        if isinstance(exc, aiohttp.ClientConnectorError):  # no connection: the upstream saw nothing
            call.sent = False
        call.error = _failure(exc, upstream, settings, got if call.status is not None else None)
        if answer is None:  # nothing sent yet: the agent gets the reason
            status = 504 if isinstance(exc, TimeoutError) else 502
            return error_response(web, protocol, status, f"model gateway: {call.error}", "api_error")
        if got.sse:  # the stream broke off: an error event tells the agent's client why
            event = b"event: error\n" if protocol == "anthropic" else b""
            said = error_body(protocol, 502, f"model gateway: {call.error}", "api_error")
            with contextlib.suppress(Exception):  # the agent may be gone too
                await answer.write(event + b"data: " + said + b"\n\n")
        answer.force_close()  # and the answer ends there
        return answer
    except ConnectionResetError:  # the agent hung up while the answer streamed to it
        if not reader.complete:  # else it had the whole answer: a completed call
            call.error = "the agent hung up before the answer ended"
        return answer
    except asyncio.CancelledError:
        # An agent that hangs up once the last event reached it (before the upstream
        # ended its body) had a completed call: its usage counts, and it is no error.
        if not reader.complete:
            call.error = call.error or "cancelled: the agent hung up or its attempt ended"
        raise
    finally:
        call.latency = time.perf_counter() - started
        call.usage, call.finish_reason, call.message = reader.usage, reader.finish_reason, reader.message()
        if generate:
            grant.record(call)


class _Received:
    """How much of the upstream's answer arrived: what an error after its headers says."""

    def __init__(self) -> None:
        #: The answer's body stream, once its headers arrived (it counts the bytes read from it).
        self.content: Any = None
        #: Whether the answer was being forwarded as it arrived (its headers already went to the agent).
        self.streaming = False
        #: Whether the answer is server-sent events.
        self.sse = False
        #: Server-sent events forwarded whole.
        self.events = 0

    def __str__(self) -> str:
        size = int(getattr(self.content, "total_bytes", 0) or 0)
        events = f", {self.events} event{'' if self.events == 1 else 's'}" if self.events else ""
        return f"{size} bytes{events}"


def _failure(exc: BaseException, upstream: Upstream, settings: GatewaySettings, got: _Received | None) -> str:
    """The call's error: the upstream could not be reached, did not answer, or (``got``: its headers
    had arrived) its answer broke off, and how much of it had come."""
    who = f"the {upstream.family} upstream {upstream.endpoint}"
    timeout = isinstance(exc, TimeoutError)
    if got is None:
        what = f"no answer within {settings.timeout:g}s from {who}" if timeout else f"cannot reach {who}"
    elif timeout:
        what = f"{who} sent no more of its response within {settings.timeout:g}s (after {got})"
    else:
        what = f"the response of {who} was cut off{' mid-stream' if got.streaming else ''} after {got}"
    detail = f": {exc}" if str(exc) and not timeout else ""
    return f"{type(exc).__name__}: {what}{detail}"


async def _pipe(reply: Any, answer: Any, reader: AnswerReader, mask: SecretMask, got: _Received, *, sse: bool) -> None:
    """Forward a streamed answer chunk by chunk as it arrives (secrets masked), reading a copy."""
    parser = SSEParser()
    kept = bytearray()
    got.streaming, got.sse = True, sse

    async def send(chunk: bytes) -> None:
        if not chunk:
            return
        await answer.write(chunk)
        if sse:
            for name, data in parser.feed(chunk):
                got.events += 1
                reader.event(name, _json(data.encode()) if data != "[DONE]" else data)
        else:  # Gemini without alt=sse: one JSON array, read whole at the end
            kept.extend(chunk)

    async for chunk in reply.content.iter_any():
        await send(mask.chunk(chunk))
    await send(mask.flush())
    if not sse:
        _read_body(reader, bytes(kept))
    await answer.write_eof()


def _read_body(reader: AnswerReader, payload: bytes) -> None:
    value = _json(payload)
    if value is not None:
        reader.body(value)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _kept(raw: bytes, value: Any, settings: GatewaySettings) -> Any:
    """A body as the trajectory keeps it: the JSON value, or its beginning when it is too long."""
    limit = settings.record_bodies
    if not limit or not raw:
        return None
    if len(raw) <= limit and value is not None:
        return value
    return {"truncated": len(raw) > limit, "bytes": len(raw), "text": raw[:limit].decode("utf-8", "replace")}


def error_response(web: Any, protocol: Protocol, status: int, message: str, kind: str) -> Any:
    body = error_body(protocol, status, message, kind)
    return web.Response(body=body, status=status, content_type="application/json")
