"""One OpenAI-compatible endpoint: the async client, the connection cap, error messages.

The client (``openai.AsyncOpenAI``) holds an ``httpx`` pool bound to the event
loop that created it, so a :class:`ChatModel` keeps one client per loop: one
for a whole in-process run, one per task loop under pytest-xdist. Whoever owns
the ChatModel calls :meth:`ChatModel.aclose` on that loop before it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PreflightError
from ..limits import CapacityPermits, capacity_for
from ..redact import SecretLogFilter, add_runtime_secret
from .settings import ResolvedModel

__all__ = ["ChatModel", "ChatReply", "ModelCallError", "ToolCall", "guard_secrets", "require_openai"]

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
        self, message: str, *, status: int | None = None, retryable: bool = True, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retryable = retryable
        #: ``rate_limit``, ``transport`` or ``timeout`` when the client's exception class says so:
        #: recorded as the result's ``error_kind`` (the retry policy never reads the message).
        self.kind = kind


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it; may be malformed

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ChatReply:
    """The first choice of one chat completion, with its usage and latency."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    latency: float = 0.0

    def message(self) -> dict[str, Any]:
        """The assistant message as it goes back into the conversation."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return out


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
            latency = time.perf_counter() - started
        return _reply(response, latency)

    async def aclose(self) -> None:
        """Close the client of the running loop (idempotent)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    # -- errors --------------------------------------------------------------
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
                )
            kind = "rate_limit" if status == 429 else "transport" if status >= 500 else None
            return ModelCallError(f"{name} (HTTP {status}) from {endpoint}{after}: {detail}", status=status, kind=kind)
        if isinstance(exc, openai.APITimeoutError):
            timeout = self.resolved.settings.timeout
            return ModelCallError(f"{name}: no answer from {endpoint} within {timeout:g}s{after}", kind="timeout")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            return ModelCallError(
                f"{name}: cannot reach {endpoint}{after}: {type(cause).__name__}: {cause}", kind="transport"
            )
        return ModelCallError(f"{name}: {exc}")


def _detail(exc: Any) -> str:
    """The server's own error message, short."""
    body = getattr(exc, "body", None)
    message: Any = None
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, Mapping) else inner
    text = str(message if message is not None else getattr(exc, "message", exc))
    return text if len(text) <= 300 else text[:300] + "..."


def _reply(response: Any, latency: float) -> ChatReply:
    choices = getattr(response, "choices", None) or []
    if not choices:
        raise ModelCallError("APIResponseValidationError: the endpoint returned no choices")
    choice = choices[0]
    message = choice.message
    calls = []
    for call in getattr(message, "tool_calls", None) or []:
        function = getattr(call, "function", None)
        if function is None:
            continue  # a non-function tool type: the agent offered none
        calls.append(ToolCall(id=str(call.id), name=str(function.name), arguments=str(function.arguments or "")))
    usage = getattr(response, "usage", None)
    counts = None
    if usage is not None:
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        total = getattr(usage, "total_tokens", None)
        counts = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": int(total) if total is not None else prompt + completion,
        }
    return ChatReply(
        content=message.content,
        tool_calls=calls,
        finish_reason=choice.finish_reason,
        usage=counts,
        latency=latency,
    )
