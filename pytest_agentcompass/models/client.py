"""One OpenAI-compatible endpoint: the async client, the connection cap, error messages.

The client (``openai.AsyncOpenAI``) holds an ``httpx`` pool bound to the event
loop that created it, so a :class:`ChatModel` keeps one client per loop: one
for a whole in-process run, one per task loop under pytest-xdist. Whoever owns
the ChatModel calls :meth:`ChatModel.aclose` on that loop before it ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..concurrency.limits import CapacityPermits, capacity_for
from ..vocabulary.errors import PreflightError
from ..vocabulary.redact import SecretLogFilter, add_runtime_secret
from .reply import ChatReply, ReplyShapeError, ToolCall, parse_reply
from .settings import ResolvedModel

__all__ = [
    "ChatModel",
    "ChatReply",
    "MalformedResponseError",
    "ModelCallError",
    "ToolCall",
    "guard_secrets",
    "require_openai",
]

#: HTTP statuses that no retry can fix: the key or its permissions are wrong.
PERMANENT_STATUSES = frozenset({401, 403})


#: Loggers that may print request contents at DEBUG level, depending on the client version.
_CLIENT_LOGGERS = ("openai", "openai._base_client", "httpx", "httpx2", "httpcore", "httpcore2")
_log_filter = SecretLogFilter()


def guard_secrets(*values: str) -> None:
    """Mask ``values`` (an API key, header values) in the run directory, reports and client logs.

    A key read from the process environment is no ``${VAR}`` of the config,
    so the config's redaction does not know it.
    """
    for value in values:
        add_runtime_secret(value)
    for name in _CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if _log_filter not in logger.filters:
            logger.addFilter(_log_filter)


def require_openai() -> None:
    """:raises PreflightError: when the ``openai`` package cannot be imported."""
    try:
        import openai  # noqa: F401
    except ImportError as exc:
        raise PreflightError(
            f"the openai package is not installed ({exc}): pip install 'pytest-agentcompass[openai]'"
        ) from None


class ModelCallError(Exception):
    """A model call that failed after the client's own retries.

    ``str()`` names the error class and the HTTP status, so that
    ``retry_pattern_list`` entries such as ``RateLimitError`` or ``429`` match.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = True,
        kind: str | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        #: ``rate_limit``, ``transport`` or ``timeout`` when the client's exception class says so:
        #: recorded as the result's ``error_kind`` (the retry policy never reads the message).
        self.kind = kind
        #: The class of the failure: the client's (``RateLimitError``, ``APIConnectionError``, ...) or
        #: this one's own. A harness records it with its result (``metadata.error_type``), where
        #: retry policies can see it without reading the message.
        self.error_type = error_type or type(self).__name__


class MalformedResponseError(ModelCallError):
    """The endpoint answered, but not with a chat completion: a body that is not JSON, or JSON
    of another shape (a proxy's page, a truncated or garbled answer). The server's fault, as a
    connection error would be: a retry may get a good answer."""


class ChatModel:
    """The model of one request, called through the official async client."""

    def __init__(self, resolved: ResolvedModel) -> None:
        self.resolved = resolved
        self.permits: CapacityPermits = capacity_for(f"model:{resolved.endpoint}", resolved.settings.max_connections)
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._sampling = resolved.settings.sampling()

    @property
    def name(self) -> str:
        return self.resolved.name

    def client(self) -> Any:
        """The ``AsyncOpenAI`` client of the running loop, created on first use."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            import openai

            for stale in [other for other in self._clients if other.is_closed()]:
                del self._clients[stale]  # its loop is gone, and its sockets with it
            settings = self.resolved.settings
            client = openai.AsyncOpenAI(
                api_key=self.resolved.api_key,
                base_url=self.resolved.base_url,
                timeout=settings.timeout,
                max_retries=settings.max_retries,
                default_headers=settings.headers or None,
            )
            self._clients[loop] = client
        return client

    async def complete(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> ChatReply:
        """One chat completion.

        :raises ModelCallError: once the client's own retries are spent.
        """
        import openai

        client = self.client()
        extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
        async with self.permits.permit():
            started = time.perf_counter()
            try:
                response = await client.chat.completions.create(
                    model=self.resolved.name, messages=list(messages), **self._sampling, **extra
                )
            except openai.OpenAIError as exc:
                raise self._describe(exc) from None
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # the client parsed a 2xx body
                body = exc.doc if isinstance(exc, json.JSONDecodeError) else exc.object
                raise self._malformed(f"is not JSON ({_reason(exc)})", body) from None
            latency = time.perf_counter() - started
        try:
            return parse_reply(response, latency)
        except ReplyShapeError as exc:
            raise self._malformed(f"is not a chat completion ({exc})", response) from None

    async def aclose(self) -> None:
        """Close the client of the running loop (idempotent)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    # -- errors --------------------------------------------------------------
    def _malformed(self, problem: str, body: Any) -> MalformedResponseError:
        """One line naming the endpoint, what is wrong and how the answer began."""
        start = body if isinstance(body, str | bytes) else _shown(body)
        text = start.decode("utf-8", "replace") if isinstance(start, bytes) else start
        excerpt = f"; it begins {text[:120]!r}" if text else "; it is empty"
        where = f"the answer of {self.resolved.endpoint} for model {self.name!r}"
        return MalformedResponseError(
            f"MalformedResponseError: {where} {problem}{excerpt}",
            kind="transport",  # the server's fault, as a dropped connection is
        )

    def _describe(self, exc: Exception) -> ModelCallError:
        import openai

        name = type(exc).__name__
        endpoint = self.resolved.endpoint
        retries = self.resolved.settings.max_retries
        after = f" after {retries} client retr{'y' if retries == 1 else 'ies'}" if retries else ""
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = _detail(exc)
            if status in PERMANENT_STATUSES:
                return ModelCallError(
                    f"{name} (HTTP {status}): {endpoint} rejected the API key for model {self.name!r} "
                    f"(check model.params.api_key): {detail}",
                    status=status,
                    retryable=False,
                    error_type=name,
                )
            kind = "rate_limit" if status == 429 else "transport" if status >= 500 else None
            message = f"{name} (HTTP {status}) from {endpoint}{after}: {detail}"
            return ModelCallError(message, status=status, kind=kind, error_type=name)
        if isinstance(exc, openai.APITimeoutError):
            timeout = self.resolved.settings.timeout
            message = f"{name}: no answer from {endpoint} within {timeout:g}s{after}"
            return ModelCallError(message, kind="timeout", error_type=name)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            # httpx's word for a server that closed the connection before its body's end: it was reached.
            what = "the answer of {} was cut off" if "complete message body" in str(cause) else "cannot reach {}"
            message = f"{name}: {what.format(endpoint)}{after}: {type(cause).__name__}: {cause}"
            return ModelCallError(message, kind="transport", error_type=name)
        if isinstance(exc, openai.APIResponseValidationError):  # strict validation, or no JSON where JSON was due
            return self._malformed(f"is not a chat completion ({exc.message})", getattr(exc, "body", None))
        return ModelCallError(f"{name} from {endpoint}: {exc}", error_type=name)


def _detail(exc: Any) -> str:
    """The server's own error message, short."""
    body = getattr(exc, "body", None)
    message: Any = None
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, Mapping) else inner
    text = str(message if message is not None else getattr(exc, "message", exc))
    return text if len(text) <= 300 else text[:300] + "..."


def _reason(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos}"
    return str(exc)


def _shown(value: Any) -> str:
    """A parsed answer as text again, for the excerpt of a malformed one."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json", exclude_unset=True, warnings=False)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
