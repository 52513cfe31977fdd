"""What ``model.params`` may hold: one strict model per way the built-ins reach a model.

:class:`ModelSettings` for a harness that calls an OpenAI-compatible endpoint
itself (``models.client``), :class:`GatewaySettings` for one whose agent reaches
the model through the gateway (``gateway/``). The config is checked against
them when it loads (a value must fit one; the harness's own is applied when
the request is built), so they live with the config, below both users.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["GatewaySettings", "ModelSettings", "http_url"]


def http_url(value: str | None) -> str | None:
    """``value`` if it is an ``http://`` or ``https://`` URL with a host (a ``${VAR}`` left empty is
    no URL either); found at load, with the key's line, not at the first model call."""
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{value!r} is not an http:// or https:// URL")
    return value


class ModelSettings(BaseModel):
    """Everything ``model.params`` may hold for an OpenAI-compatible endpoint.

    Unknown keys are errors: a misspelt ``temprature`` must not be dropped in
    silence. Parameters this list lacks go through ``extra_body``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    base_url: str | None = None  # default: $OPENAI_BASE_URL, else OpenAI's own
    api_key: str | None = Field(default=None, repr=False)  # default: $OPENAI_API_KEY
    timeout: float = Field(default=120.0, gt=0)  # seconds per request, as the client counts it
    max_retries: int = Field(default=2, ge=0)  # the client's own retries (429, 5xx, timeouts)
    max_connections: int = Field(default=0, ge=0)  # concurrent requests per endpoint, process-wide; 0 = no cap
    headers: dict[str, str] = Field(default_factory=dict)
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # what reasoning models take instead
    seed: int | None = None
    stop: str | list[str] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    #: Prices in currency units per million tokens; both set = a cost estimate in the usage.
    input_price_per_million: float | None = Field(default=None, ge=0)
    output_price_per_million: float | None = Field(default=None, ge=0)

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return http_url(value)

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments every chat completion request carries."""
        fields = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop")
        out = {name: getattr(self, name) for name in fields if getattr(self, name) is not None}
        if self.extra_body:
            out["extra_body"] = dict(self.extra_body)
        return out


class GatewaySettings(BaseModel):
    """Everything ``model.params`` may hold when the model is reached through the gateway.

    Unknown keys are errors. Sampling parameters are not among them: the
    gateway passes each request through as the agent wrote it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    #: OpenAI-compatible upstream (chat completions and Responses), as the OpenAI SDK's base URL (with ``/v1``).
    base_url: str | None = None
    #: Anthropic Messages upstream, as ``ANTHROPIC_BASE_URL`` (without ``/v1``).
    anthropic_base_url: str | None = None
    #: Gemini API upstream, as ``GOOGLE_GEMINI_BASE_URL`` (without the version).
    gemini_base_url: str | None = None
    #: The key of every upstream that has none of its own; else ``$OPENAI_API_KEY``,
    #: ``$ANTHROPIC_API_KEY``, ``$GEMINI_API_KEY`` / ``$GOOGLE_API_KEY`` per upstream.
    api_key: str | None = Field(default=None, repr=False)
    anthropic_api_key: str | None = Field(default=None, repr=False)
    gemini_api_key: str | None = Field(default=None, repr=False)
    #: Sent to every upstream with each request.
    headers: dict[str, str] = Field(default_factory=dict)
    #: Seconds an upstream may stay silent (before its answer starts, or between two pieces of a stream).
    timeout: float = Field(default=600.0, gt=0)
    #: Requests in flight per upstream endpoint, process-wide (run-wide under pytest-xdist); 0 = no cap.
    max_connections: int = Field(default=0, ge=0)
    #: Per attempt: once spent, the gateway refuses further calls (``stop_reason: token_budget``).
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    #: Prices in currency units per million tokens; both set = a cost in the usage.
    input_price_per_million: float | None = Field(default=None, ge=0)
    output_price_per_million: float | None = Field(default=None, ge=0)
    #: Pass the model an agent names through; by default every request is sent for ``model.id``.
    allow_other_models: bool = False
    #: Bytes of each request and response body kept in the trajectory (0: none).
    record_bodies: int = Field(default=64 * 1024, ge=0)

    @field_validator("base_url", "anthropic_base_url", "gemini_base_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        checked = http_url(value)
        return checked.rstrip("/") if checked else checked

    @model_validator(mode="after")
    def _cost_needs_prices(self) -> GatewaySettings:
        if self.max_cost is not None and None in (self.input_price_per_million, self.output_price_per_million):
            raise ValueError("max_cost needs input_price_per_million and output_price_per_million")
        return self
