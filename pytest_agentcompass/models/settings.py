"""``model.params`` as a strict model, and the endpoint a request talks to."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..vocabulary.errors import PreflightError

__all__ = ["DEFAULT_BASE_URL", "ModelSettings", "ResolvedModel", "resolve_model"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"


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

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments every chat completion request carries."""
        fields = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop")
        out = {name: getattr(self, name) for name in fields if getattr(self, name) is not None}
        if self.extra_body:
            out["extra_body"] = dict(self.extra_body)
        return out


class _Spec(Protocol):
    """A ``model:`` of the config (``config.ModelSpec``, which loads this module to check its params)."""

    @property
    def id(self) -> str: ...

    @property
    def params(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class ResolvedModel:
    """A model name, its settings, and the endpoint and key actually used."""

    name: str
    settings: ModelSettings
    base_url: str
    api_key: str = field(repr=False)

    @property
    def endpoint(self) -> str:
        """The key of the per-endpoint connection cap."""
        return self.base_url.rstrip("/")


def resolve_model(spec: _Spec | None, where: str, environ: Mapping[str, str] | None = None) -> ResolvedModel:
    """Validate ``spec.params`` and find the key and base URL.

    :raises PreflightError: when no model is configured, a param is wrong, or no key is found.
    """
    if spec is None:
        raise PreflightError(
            f"{where} needs a model: add `model: {{id: <model name>, params: {{...}}}}` to the request"
        )
    env = os.environ if environ is None else environ
    try:
        settings = ModelSettings.model_validate(spec.params)
    except ValidationError as exc:
        problems = "; ".join(
            f"model.params.{'.'.join(str(p) for p in e['loc'])}: "
            + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, "))
            for e in exc.errors()
        )
        raise PreflightError(problems) from None
    api_key = settings.api_key if settings.api_key is not None else env.get("OPENAI_API_KEY")
    if not api_key:
        raise PreflightError(
            'no API key for the model: set model.params.api_key (e.g. "${OPENAI_API_KEY}") '
            "or the OPENAI_API_KEY environment variable; a server that checks no key accepts any value"
        )
    base_url = settings.base_url or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    return ResolvedModel(name=spec.id, settings=settings, base_url=base_url, api_key=api_key)
