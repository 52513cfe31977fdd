"""The model gateway: an HTTP server of the runner between an agent and its model's API.

One gateway per request whose harness asks for it (``needs_gateway``),
created with the request's runtime, started on first use on the event loop
that runs the request's tasks, and closed when the request ends
(``RequestRuntime.aclose``). Under pytest-xdist each worker process runs its
own: grants and their accounting stay in the process that runs the attempt.

Each attempt opens a :class:`~.grant.Grant` with :meth:`ModelGateway.
open_attempt`. The gateway forwards the agent's requests to the upstream
of their API with the real key, which stays in this process, streams the
answers back as they arrive, and records each call in the grant.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from .._shield import uncancellable
from ..errors import PreflightError, SessionError
from ..limits import capacity_for
from ..models.client import guard_secrets
from ..models.ledger import CallLedger, ModelCall, Protocol
from ..models.trajectory import Trajectory
from ..redact import MIN_SECRET_LENGTH
from .grant import Grant
from .protocols import Route, error_body, find_route, offered_token, prepare_body, response_headers, upstream_headers
from .reading import AnswerReader, SSEParser, error_message
from .settings import Family, GatewaySettings, Upstream, family_of, resolve_upstreams

if TYPE_CHECKING:
    from ..environments.base import BaseEnvironment, EnvironmentSession

__all__ = ["ModelGateway"]

#: Request bodies an agent may send (a long conversation with tool output).
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: How long closing a grant waits for its calls still in flight to stop.
_DRAIN = 5.0


def require_aiohttp() -> None:
    """:raises PreflightError: when ``aiohttp`` cannot be imported."""
    try:
        import aiohttp  # noqa: F401
    except ImportError as exc:
        raise PreflightError(
            f"the model gateway needs aiohttp ({exc}): pip install 'pytest-agentcompass[agents]'"
        ) from None


class ModelGateway:
    """The gateway of one request.

    :param model: ``model.id``: the model every request is sent for (unless
        ``settings.allow_other_models``).
    :param provider: The request's environment provider, which routes its
        sessions to the gateway (:meth:`BaseEnvironment.host_route`).
    :param protocols: The APIs the harness's agent speaks: each needs an
        upstream key at preflight (empty: any one will do).
    """

    def __init__(
        self,
        model: str,
        settings: GatewaySettings,
        provider: BaseEnvironment,
        *,
        harness: str = "",
        protocols: frozenset[Protocol] = frozenset(),
    ) -> None:
        self.model = model
        self.settings = settings
        self.provider = provider
        self.harness = harness
        self.protocols = protocols
        self._upstreams: dict[Family, Upstream] | None = None
        self._grants: dict[str, Grant] = {}
        self._listeners: dict[str, int] = {}
        self._runner: Any = None
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None

    # -- setup ---------------------------------------------------------------------
    def preflight(self) -> None:
        """Check, before any task runs, that the gateway can work.

        :raises PreflightError: no aiohttp, no key for an API the agent speaks,
            or an environment that cannot route its sessions here.
        """
        require_aiohttp()
        if not self.provider.routes_to_host():
            raise PreflightError(
                f"environment {self.provider.spec.id!r} gives its sessions no route to the model gateway "
                f"that harness {self.harness!r} needs; use the 'local' or 'docker' environment"
            )
        self.upstreams()

    def upstreams(self) -> dict[Family, Upstream]:
        """Each API family's upstream, with its key (read from the environment on first use)."""
        if self._upstreams is None:
            self._upstreams = resolve_upstreams(self.settings, self.protocols)
            guard_secrets(*(u.api_key for u in self._upstreams.values() if u.api_key), *self.settings.headers.values())
        return self._upstreams

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._runner is not None and self._loop is loop:
            return
        if self._runner is not None and self._loop is not None and not self._loop.is_closed():
            raise RuntimeError("the model gateway runs on another event loop; close it there first")
        self._runner = None  # its loop is gone (a task-per-loop run): start afresh here
        self._listeners.clear()
        require_aiohttp()
        import aiohttp
        from aiohttp import web

        self.upstreams()
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=_DRAIN)
        await runner.setup()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(30.0, self.settings.timeout))
        self._client = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=0), auto_decompress=True, trust_env=True
        )
        self._runner, self._loop = runner, loop

    async def _listen(self, host: str) -> int:
        """The port the gateway listens on at ``host`` (a listener is started on first use)."""
        port = self._listeners.get(host)
        if port is not None:
            return port
        from aiohttp import web

        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
        except OSError as exc:
            sock.close()
            raise SessionError(
                f"the model gateway cannot listen on {host} ({exc.strerror or exc}); the environment's network "
                "is not on this machine (a remote Docker engine, or one in another network namespace)"
            ) from None
        await web.SockSite(self._runner, sock).start()
        port = self._listeners[host] = int(sock.getsockname()[1])
        return port

    # -- attempts --------------------------------------------------------------------
    @asynccontextmanager
    async def open_attempt(
        self,
        env: EnvironmentSession,
        task_id: str,
        attempt_index: int = 0,
        *,
        max_total_tokens: int | None = None,
        max_cost: float | None = None,
    ) -> AsyncIterator[Grant]:
        """A grant for one attempt run in ``env``; usable inside the ``async with`` block.

        Opening routes ``env`` to the gateway (a Docker container joins the
        request's internal network); closing refuses the token from then on,
        stops the calls still in flight, detaches the route and saves the
        trajectory through the attempt's artifact sink. Budgets default to
        ``model.params.max_total_tokens`` / ``max_cost``.
        """
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            await self._start()
        route = await self.provider.host_route(env)
        grant: Grant | None = None
        try:
            port = await self._listen(route.listen)
            if route.admit is not None:
                await route.admit(port)
            settings = self.settings
            ledger = CallLedger(
                input_price_per_million=settings.input_price_per_million,
                output_price_per_million=settings.output_price_per_million,
                max_total_tokens=max_total_tokens if max_total_tokens is not None else settings.max_total_tokens,
                max_cost=max_cost if max_cost is not None else settings.max_cost,
            )
            endpoints = {family: u.endpoint for family, u in self.upstreams().items()}
            trajectory = Trajectory(
                harness=self.harness,
                model=self.model,
                endpoint=None,
                task_id=task_id,
                ledger=ledger,
                attempt_index=attempt_index,
                upstreams=endpoints,
            )
            host = f"[{route.host}]" if ":" in route.host else route.host
            grant = Grant(self.model, f"agc-{secrets.token_hex(24)}", f"http://{host}:{port}", trajectory)
            self._grants[grant.token] = grant
            yield grant
        finally:
            await uncancellable(self._close_grant(grant, route.release))

    async def _close_grant(self, grant: Grant | None, release: Any) -> None:
        try:
            if grant is not None:
                grant.closed = True
                self._grants.pop(grant.token, None)
                pending = [t for t in grant.in_flight if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=_DRAIN)
        finally:
            try:
                if release is not None:
                    await release()
            finally:
                if grant is not None:
                    grant.save()

    async def aclose(self) -> None:
        """Stop listening and close the upstream connections (idempotent; on the loop it started on)."""
        runner, client = self._runner, self._client
        self._runner = self._client = None
        self._listeners.clear()
        self._starting = None  # an asyncio lock belongs to one loop: the next start may be on another
        if runner is None or self._loop is not asyncio.get_running_loop():
            return  # never started, or its loop is gone and its sockets with it
        try:
            await runner.cleanup()
        finally:
            await client.close()

    # -- requests ----------------------------------------------------------------------
    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        route = find_route(request.method, request.path, request.headers)
        if route is None:
            message = f"the model gateway does not forward {request.method} {request.path}"
            return _error(web, "openai_chat", 404, message, "not_found_error")
        token = offered_token(request.headers, request.query)
        grant = self._grants.get(token) if token else None
        if grant is None or grant.closed:
            message = "unknown or expired model gateway token: each attempt has its own, valid while it runs"
            return _error(web, route.protocol, 401, message, "authentication_error")
        upstream = self.upstreams()[family_of(route.protocol)]
        if not upstream.api_key:
            message = f"the model gateway has no API key for the {upstream.family} API (see model.params)"
            return _error(web, route.protocol, 401, message, "authentication_error")
        work = asyncio.ensure_future(self._forward(request, route, grant, upstream))
        grant.in_flight.add(work)
        try:
            return await work  # a client that hangs up cancels the handler, and this with it
        finally:
            grant.in_flight.discard(work)

    async def _forward(self, request: Any, route: Route, grant: Grant, upstream: Upstream) -> Any:
        import aiohttp
        from aiohttp import web
        from yarl import URL

        protocol, settings = route.protocol, self.settings
        raw = await request.read()
        encoding = request.headers.get("Content-Encoding", "identity").lower()
        if encoding in ("gzip", "deflate"):
            raw = zlib.decompress(raw, zlib.MAX_WBITS | 32)
        elif encoding != "identity":
            message = f"request Content-Encoding {encoding!r} is not supported"
            return _error(web, protocol, 415, message, "invalid_request_error")
        try:
            body: Any = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        generate = route.kind == "generate"
        if generate:
            spent = grant.ledger.spent()
            if spent is not None:
                grant.ledger.refused += 1
                refused = ModelCall(protocol, self.model, status=403, error=spent, extra={"refused": "token_budget"})
                grant.record(refused)
                message = f"{spent}; the model gateway refuses further calls"
                refusal = _error(web, protocol, 403, message, "budget_exceeded")
                refusal.headers["x-should-retry"] = "false"
                return refusal
        sent, asked = prepare_body(protocol, body, self.model, settings.allow_other_models)
        asked = asked or route.path_model
        path = request.rel_url.raw_path
        if not settings.allow_other_models:
            path = route.with_model(path, self.model)
        query = [(k, v) for k, v in request.query.items() if k != "key"]
        url = upstream.url(path) + (f"?{urlencode(query)}" if query else "")
        data = raw if sent is body else json.dumps(sent).encode()
        headers = upstream_headers(request.headers, protocol, upstream.api_key or "", settings.headers)
        streamed = route.path_stream or (isinstance(body, dict) and bool(body.get("stream")))
        call = ModelCall(protocol, self.model, status=None, stream=streamed, request=_kept(raw, body, settings))
        call.extra["path"] = request.path
        if asked and asked != self.model:
            call.extra["requested_model"] = asked
        reader = AnswerReader(protocol)
        scrub = _scrubber(upstream.api_key)
        answer: Any = None
        started = time.perf_counter()
        try:
            async with capacity_for(f"model:{upstream.endpoint}", settings.max_connections).permit():
                started = time.perf_counter()
                async with self._client.request(
                    request.method,
                    URL(url, encoded=True),
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=settings.timeout, sock_connect=30),
                ) as reply:
                    call.status = reply.status
                    out = response_headers(reply.headers)
                    if reply.content_type == "text/event-stream" or (route.path_stream and reply.status < 400):
                        answer = web.StreamResponse(status=reply.status, headers=out)
                        await answer.prepare(request)
                        await _pipe(reply, answer, reader, scrub, sse=reply.content_type == "text/event-stream")
                    else:
                        payload = scrub(await reply.read())
                        _read_body(reader, payload)
                        if reply.status >= 400:
                            call.error = error_message(payload)
                        call.response = _kept(payload, _json(payload), settings)
                        answer = web.Response(body=payload, status=reply.status, headers=out)
            return answer
        except (aiohttp.ClientError, TimeoutError) as exc:
            what = "no answer within" if isinstance(exc, TimeoutError) else "cannot reach"
            call.error = f"{type(exc).__name__}: {what} the {upstream.family} upstream {upstream.endpoint}"
            if isinstance(exc, TimeoutError):
                call.error += f" ({settings.timeout:g}s)"
            elif str(exc):
                call.error += f": {exc}"
            if answer is None:  # nothing sent yet: the agent gets the reason
                status = 504 if isinstance(exc, TimeoutError) else 502
                return _error(web, protocol, status, f"model gateway: {call.error}", "api_error")
            answer.force_close()  # the stream broke off: the agent sees it end early
            return answer
        except ConnectionResetError:  # the agent hung up while the answer streamed to it
            call.error = "the agent hung up before the answer ended"
            return answer
        except asyncio.CancelledError:
            call.error = call.error or "cancelled: the agent hung up or its attempt ended"
            raise
        finally:
            call.latency = time.perf_counter() - started
            call.usage, call.finish_reason, call.message = reader.usage, reader.finish_reason, reader.message()
            if generate:
                grant.record(call)


async def _pipe(reply: Any, answer: Any, reader: AnswerReader, scrub: Any, *, sse: bool) -> None:
    """Forward a streamed answer chunk by chunk as it arrives, reading a copy."""
    parser = SSEParser()
    kept = bytearray()
    async for chunk in reply.content.iter_any():
        chunk = scrub(chunk)
        await answer.write(chunk)
        if sse:
            for name, data in parser.feed(chunk):
                reader.event(name, _json(data.encode()) if data != "[DONE]" else None)
        else:  # Gemini without alt=sse: one JSON array, read whole at the end
            kept += chunk
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


def _scrubber(key: str | None) -> Any:
    """Masks the real key in what goes back to the agent (an upstream error may quote it)."""
    if not key or len(key) < MIN_SECRET_LENGTH:
        return lambda data: data
    needle = key.encode()
    return lambda data: data.replace(needle, b"***") if needle in data else data


def _error(web: Any, protocol: Protocol, status: int, message: str, kind: str) -> Any:
    body = error_body(protocol, status, message, kind)
    return web.Response(body=body, status=status, content_type="application/json")
