"""``model.params`` of a request whose harness reaches the model through the gateway.

Validated when the config is loaded (problems name the file and line); keys
are read from the process environment only when the gateway starts, so a
config can be checked on a machine that holds no key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..models.ledger import Protocol
from ..vocabulary.errors import PreflightError

__all__ = ["FAMILIES", "Family", "GatewaySettings", "Upstream", "family_of"]

#: Upstreams are configured per API family: both OpenAI APIs share one endpoint and key.
Family = Literal["openai", "anthropic", "gemini"]
FAMILIES: tuple[Family, ...] = ("openai", "anthropic", "gemini")

#: Where each family goes when the config and the environment name nothing, and the variables read first.
_DEFAULT_URL: dict[Family, tuple[str, str]] = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
    "gemini": ("GOOGLE_GEMINI_BASE_URL", "https://generativelanguage.googleapis.com"),
}
_KEY_VARIABLES: dict[Family, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
}


def family_of(protocol: Protocol) -> Family:
    return "openai" if protocol.startswith("openai") else protocol  # type: ignore[return-value]


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
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _cost_needs_prices(self) -> GatewaySettings:
        if self.max_cost is not None and None in (self.input_price_per_million, self.output_price_per_million):
            raise ValueError("max_cost needs input_price_per_million and output_price_per_million")
        return self


@dataclass(frozen=True)
class Upstream:
    """Where one API family's requests go, and the key they carry there."""

    family: Family
    base_url: str
    api_key: str | None = field(repr=False)

    @property
    def endpoint(self) -> str:
        """The key of the per-endpoint connection cap (shared with the harnesses' own clients)."""
        return self.base_url.rstrip("/")

    def url(self, path: str) -> str:
        """The upstream URL of a gateway path (``/v1/chat/completions``, ``/v1beta/models/...``)."""
        if self.family == "openai":  # the OpenAI base URL holds the version
            return self.base_url + path.removeprefix("/v1")
        return self.base_url + path


def resolve_upstreams(
    settings: GatewaySettings, required: frozenset[Protocol] = frozenset(), environ: Mapping[str, str] | None = None
) -> dict[Family, Upstream]:
    """Each family's upstream, keys from the config or the environment.

    :raises PreflightError: when a family in ``required`` (or, with none
        required, every family) has no key.
    """
    env = os.environ if environ is None else environ
    out: dict[Family, Upstream] = {}
    for family in FAMILIES:
        variable, default = _DEFAULT_URL[family]
        url = getattr(settings, "base_url" if family == "openai" else f"{family}_base_url") or env.get(variable)
        own = None if family == "openai" else getattr(settings, f"{family}_api_key")
        key = own or settings.api_key or next((env[v] for v in _KEY_VARIABLES[family] if env.get(v)), None)
        out[family] = Upstream(family, (url or default).rstrip("/"), key)
    needed = {family_of(p) for p in required}
    missing = [f for f in FAMILIES if f in needed and not out[f].api_key]
    if missing or not any(u.api_key for u in out.values()):
        names = missing or list(FAMILIES)
        hints = "; ".join(
            f"{f}: model.params.{'api_key' if f == 'openai' else f + '_api_key'} or ${_KEY_VARIABLES[f][0]}"
            for f in names
        )
        raise PreflightError(f"no API key for the model gateway's upstream ({hints})")
    return out
