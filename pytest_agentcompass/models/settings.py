"""The endpoint a request talks to: ``model.params`` (:class:`ModelSettings`, a strict model kept
with the config, which is checked against it when it loads) with its key and base URL found."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from ..config.model_params import ModelSettings
from ..vocabulary.errors import PreflightError

__all__ = ["DEFAULT_BASE_URL", "ModelSettings", "ResolvedModel", "resolve_model"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class _Spec(Protocol):
    """A ``model:`` of the config (``config.ModelSpec``)."""

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
