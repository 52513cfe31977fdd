"""What the gateway knows about each model API on the way in: routes, keys, models, errors.

The gateway serves every API on one port, at the paths the official clients
use, so each client's base URL is the gateway's address (plus ``/v1`` for
OpenAI's). Only the calls an agent needs are forwarded; anything else is
refused, so the real key cannot be used for other operations of the account.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..models.ledger import Protocol

__all__ = [
    "AUTH_HEADERS",
    "Route",
    "error_body",
    "find_route",
    "offered_token",
    "upstream_headers",
]

#: Where clients put their key; none of these goes upstream as the agent sent it.
AUTH_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
#: Hop-by-hop and framing headers: the gateway's own HTTP stack sets them on each leg.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
    }
)
_GEMINI_PREFIXES = ("/v1beta/models/", "/v1/models/", "/v1alpha/models/")
_GEMINI_VERBS = {"generateContent": "generate", "streamGenerateContent": "generate", "countTokens": "info"}


@dataclass(frozen=True)
class Route:
    """One forwardable request: its API, whether it generates (counts as a model call), and its model."""

    protocol: Protocol
    kind: Literal["generate", "info"]
    #: The model named in the path (Gemini), else ``None`` (named in the body).
    path_model: str | None = None
    #: Streamed by the path (Gemini's ``streamGenerateContent``); the others say it in the body.
    path_stream: bool = False

    def with_model(self, path: str, model: str) -> str:
        """``path`` naming ``model`` instead (Gemini's model is in the path)."""
        if self.path_model is None:
            return path
        head, _, rest = path.rpartition(f"/{self.path_model}:")
        return f"{head}/{model}:{rest}"


def find_route(method: str, path: str, headers: Mapping[str, str]) -> Route | None:
    """The route of a request, ``None`` when the gateway does not forward it.

    ``GET /v1/models`` exists in three APIs: the key's header tells which
    client asks (``x-api-key``: Anthropic, ``x-goog-api-key``: Gemini).
    """
    if method == "POST":
        if path == "/v1/chat/completions":
            return Route("openai_chat", "generate")
        if path == "/v1/responses":
            return Route("openai_responses", "generate")
        if path == "/v1/messages":
            return Route("anthropic", "generate")
        if path == "/v1/messages/count_tokens":
            return Route("anthropic", "info")
        for prefix in _GEMINI_PREFIXES:
            if path.startswith(prefix):
                model, _, verb = path[len(prefix) :].partition(":")
                kind = _GEMINI_VERBS.get(verb)
                if model and "/" not in model and kind is not None:
                    return Route("gemini", kind, model, verb == "streamGenerateContent")  # type: ignore[arg-type]
        return None
    listing = path in ("/v1/models", "/v1beta/models") or path.startswith(("/v1/models/", "/v1beta/models/"))
    if method == "GET" and listing:
        if "x-goog-api-key" in headers or path.startswith("/v1beta/"):
            return Route("gemini", "info")
        if "x-api-key" in headers or "anthropic-version" in headers:
            return Route("anthropic", "info")
        return Route("openai_chat", "info")
    return None


def offered_token(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The key the client sent, wherever its API puts it."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-api-key") or headers.get("x-goog-api-key") or headers.get("api-key") or query.get("key")


def upstream_headers(
    incoming: Mapping[str, str], protocol: Protocol, api_key: str, extra: Mapping[str, str]
) -> dict[str, str]:
    """The agent's headers for the upstream: its key and the hop-by-hop ones replaced."""
    out = {k: v for k, v in incoming.items() if k.lower() not in _HOP and k.lower() not in AUTH_HEADERS}
    out.update(extra)
    if protocol == "anthropic":
        out["x-api-key"] = api_key
    elif protocol == "gemini":
        out["x-goog-api-key"] = api_key
    else:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def response_headers(incoming: Mapping[str, str]) -> dict[str, str]:
    """The upstream's headers for the agent (the body is re-framed, so no length or encoding)."""
    return {k: v for k, v in incoming.items() if k.lower() not in _HOP}


def error_body(protocol: Protocol, status: int, message: str, kind: str) -> bytes:
    """An error as the API of ``protocol`` writes it, so the agent's client reads the message."""
    body: dict[str, Any]
    if protocol == "anthropic":
        body = {"type": "error", "error": {"type": kind, "message": message}}
    elif protocol == "gemini":
        body = {"error": {"code": status, "message": message, "status": kind.upper()}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
    return json.dumps(body).encode()


def prepare_body(protocol: Protocol, body: Any, model: str, allow_other_models: bool) -> tuple[Any, str | None]:
    """The request body to send and the model the agent asked for.

    The model is pinned to the configured one unless ``allow_other_models``;
    a streamed chat completion asks for its usage (``stream_options.
    include_usage``), which the accounting needs: clients ignore the extra,
    choice-less last chunk.
    """
    if not isinstance(body, dict):
        return body, None
    asked = body.get("model")
    if protocol == "gemini":
        return body, None
    changed = dict(body)
    if not allow_other_models and "model" in body:
        changed["model"] = model
    if protocol == "openai_chat" and body.get("stream"):
        options = body.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        if not options.get("include_usage"):
            options["include_usage"] = True
            changed["stream_options"] = options
    return changed, asked if isinstance(asked, str) else None
