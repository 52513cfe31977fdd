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
import secrets
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ..concurrency.shield import uncancellable
from ..models.client import guard_secrets
from ..models.ledger import CallLedger, Protocol
from ..models.trajectory import Trajectory
from ..vocabulary.errors import PreflightError, SessionError
from .forward import error_response, forward
from .grant import Grant
from .protocols import find_route, offered_token
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
    :param secrets: The config's secret values (``${VAR}`` expansions), masked
        like the keys in every answer forwarded to an agent.
    """

    def __init__(
        self,
        model: str,
        settings: GatewaySettings,
        provider: BaseEnvironment,
        *,
        harness: str = "",
        protocols: frozenset[Protocol] = frozenset(),
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.model = model
        self.settings = settings
        self.provider = provider
        self.harness = harness
        self.protocols = protocols
        self.secrets = secrets
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
            return error_response(web, "openai_chat", 404, message, "not_found_error")
        token = offered_token(request.headers, request.query)
        grant = self._grants.get(token) if token else None
        if grant is None or grant.closed:
            message = "unknown or expired model gateway token: each attempt has its own, valid while it runs"
            return error_response(web, route.protocol, 401, message, "authentication_error")
        upstream = self.upstreams()[family_of(route.protocol)]
        if not upstream.api_key:
            message = f"the model gateway has no API key for the {upstream.family} API (see model.params)"
            return error_response(web, route.protocol, 401, message, "authentication_error")
        options = {"model": self.model, "settings": self.settings, "client": self._client, "secrets": self.secrets}
        work = asyncio.ensure_future(forward(request, route, grant, upstream, **options))
        grant.in_flight.add(work)
        try:
            return await work  # a client that hangs up cancels the handler, and this with it
        finally:
            grant.in_flight.discard(work)
