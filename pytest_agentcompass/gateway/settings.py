"""The gateway's upstreams: ``model.params`` of a request whose harness reaches the model
through the gateway (:class:`GatewaySettings`, kept with the config).

Validated when the config is loaded (problems name the file and line); keys
are read from the process environment only when the gateway starts, so a
config can be checked on a machine that holds no key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..config.model_params import GatewaySettings
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
