"""One attempt's access to the model gateway: its token, its URLs, and its accounting."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ..models.ledger import CallLedger, ModelCall, Protocol
from ..models.trajectory import Trajectory
from ..models.usage import Usage, unknown_usage_note
from ..vocabulary.artifacts import save_artifact
from ..vocabulary.types import RunResult, RunStatus

__all__ = ["TRAJECTORY_FILE", "Grant"]

TRAJECTORY_FILE = "trajectory.json"
#: Where each API's client expects its base URL (OpenAI's includes the version).
_SUFFIX: dict[Protocol, str] = {"openai_chat": "/v1", "openai_responses": "/v1", "anthropic": "", "gemini": ""}


class Grant:
    """What ``ModelGateway.open_attempt`` gives a harness for one attempt.

    ``token`` is the only key the agent gets: the gateway accepts it (as a
    bearer token, ``x-api-key``, ``x-goog-api-key`` or ``?key=``) while the
    grant is open and refuses it (401) once the attempt ended. Every call made
    with it is recorded here: :attr:`calls`, :meth:`usage`, and the
    trajectory saved as an artifact when the grant closes.
    """

    def __init__(self, model: str, token: str, origin: str, trajectory: Trajectory) -> None:
        #: The model every call is sent for (``model.id``).
        self.model = model
        self.token = token
        #: ``http://host:port`` as the session reaches the gateway.
        self.origin = origin
        self.trajectory = trajectory
        self.closed = False
        #: Path of the saved trajectory (relative to the run directory), once the grant closed.
        self.trajectory_path: str | None = None
        self.in_flight: set[asyncio.Task[Any]] = set()

    # -- for the agent -------------------------------------------------------------
    def base_url(self, protocol: Protocol) -> str:
        """The base URL to give ``protocol``'s client, as seen from inside the session.

        ``openai_chat`` / ``openai_responses``: ``http://host:port/v1`` (``OPENAI_BASE_URL``);
        ``anthropic``: ``http://host:port`` (``ANTHROPIC_BASE_URL``); ``gemini``:
        ``http://host:port`` (``GOOGLE_GEMINI_BASE_URL``, the SDK's ``base_url``).
        """
        return self.origin + _SUFFIX[protocol]

    def env(self) -> dict[str, str]:
        """The variables the official clients (and most agent CLIs) read, all set to this grant."""
        return {
            "OPENAI_BASE_URL": self.base_url("openai_chat"),
            "OPENAI_API_KEY": self.token,
            "ANTHROPIC_BASE_URL": self.base_url("anthropic"),
            "ANTHROPIC_API_KEY": self.token,
            "GOOGLE_GEMINI_BASE_URL": self.base_url("gemini"),
            "GEMINI_API_KEY": self.token,
            "AGENTCOMPASS_MODEL": self.model,
        }

    # -- accounting ------------------------------------------------------------------
    @property
    def ledger(self) -> CallLedger:
        return self.trajectory.ledger

    @property
    def calls(self) -> list[ModelCall]:
        """Every model call made with this grant, in the order they ended."""
        return self.ledger.calls

    def usage(self) -> Usage:
        """Token totals (and cost, when prices are configured) of the calls so far."""
        return self.ledger.usage

    @property
    def stop_reason(self) -> str | None:
        """``token_budget`` once the gateway refused a call because the budget was spent."""
        return "token_budget" if self.ledger.refused else None

    def record(self, call: ModelCall) -> None:
        self.trajectory.record_call(call)

    def finish(self, result: RunResult) -> RunResult:
        """``result`` with this attempt's usage, model calls and trajectory (call it after the grant closed).

        When the budget stopped the agent, an agent that then failed is not an
        inference error (a retry would only spend a new budget): the result
        is evaluated on what the agent did, ``stop_reason: token_budget``, its
        error kept as ``agent_error``.
        """
        metadata: dict[str, Any] = {
            **result.metadata,
            "usage": self.usage().to_dict(),
            "model": self.model,
            "turns": self.trajectory.turns,
        }
        if self.calls:
            metadata["last_turns"] = self.trajectory.tail()
        unknown = self.usage().calls_without_usage
        if unknown:  # the totals are a lower bound: say so where they are read
            metadata["usage_note"] = unknown_usage_note(unknown)
        status, error = result.status, result.error
        if self.stop_reason is not None:
            metadata["stop_reason"] = self.stop_reason
            if status is RunStatus.INFERENCE_ERROR:
                metadata["agent_error"] = error
                status, error = RunStatus.COMPLETED, None
        artifacts = dict(result.artifacts)
        if self.trajectory_path:
            artifacts["trajectory"] = self.trajectory_path
        return dataclasses.replace(result, status=status, error=error, metadata=metadata, artifacts=artifacts)

    def save(self) -> None:
        """Write the trajectory through the attempt's artifact sink (secrets masked by the store)."""
        self.trajectory.stop_reason = self.trajectory.stop_reason or self.stop_reason
        self.trajectory_path = save_artifact(TRAJECTORY_FILE, self.trajectory.to_dict())
