"""The one seam between an agent CLI and its model: the endpoint the agent inside the Environment calls.

Every agent harness asks :func:`model_endpoint` for a base URL, a key and
the model name, in the API it speaks, and writes them into the agent's own
settings; nothing else in the harnesses knows where the model is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ...errors import PreflightError
from ...models.client import guard_secrets
from ...models.settings import resolve_model

if TYPE_CHECKING:
    from ...config import RunRequest
    from ...environments.base import EnvironmentSession
    from ...types import ExecutionPlan

__all__ = ["PROTOCOLS", "ModelEndpoint", "Protocol", "check_model", "model_endpoint"]

#: The model APIs agent CLIs speak.
Protocol = Literal["openai_chat", "openai_responses", "anthropic", "gemini"]
PROTOCOLS: tuple[Protocol, ...] = ("openai_chat", "openai_responses", "anthropic", "gemini")


@dataclass(frozen=True)
class ModelEndpoint:
    """Where the agent sends its model calls, as seen from inside the Environment.

    :param base_url: OpenAI's APIs: up to and including ``/v1``; Anthropic's and
        Gemini's: the root (their clients add ``/v1/messages``, ``/v1beta/models/...``).
    :param api_key: What the agent presents; masked wherever it is written.
    """

    protocol: Protocol
    base_url: str
    model: str
    api_key: str = field(repr=False)


def check_model(req: RunRequest, harness: str) -> None:
    """:raises PreflightError: when the request names no usable model for ``harness``."""
    resolve_model(req.model, f"harness {harness!r}")


async def model_endpoint(
    req: RunRequest, env: EnvironmentSession, plan: ExecutionPlan, protocol: Protocol
) -> ModelEndpoint:
    """The endpoint for one attempt: the request's ``model.params`` (``base_url``, ``api_key``).

    The URL must be reachable from inside the Environment and speak ``protocol``.
    """
    model = resolve_model(req.model, "an agent CLI harness")
    if not model.settings.base_url:
        raise PreflightError(
            "an agent CLI needs model.params.base_url: the endpoint it calls from inside the environment"
        )
    guard_secrets(model.api_key)
    base = model.base_url.rstrip("/")
    if protocol in ("anthropic", "gemini"):
        base = base.removesuffix("/v1")
    return ModelEndpoint(protocol, base, model.name, model.api_key)
