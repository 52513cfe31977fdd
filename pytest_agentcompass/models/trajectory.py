"""The record of one agent run: every message, model call and tool result, in order.

Written as ``trajectory.json`` next to the task's detail (see docs/api.md for
the format). The same record renders the last turns shown with a failed
task's pytest report. Model calls go through the attempt's
:class:`~.ledger.CallLedger`, so usage and the budget are counted the same
way for a harness that calls the model itself and for an agent behind the
model gateway.
"""

from __future__ import annotations

from typing import Any

from .ledger import CallLedger, ModelCall
from .reply import ChatReply
from .usage import Usage

__all__ = ["TRAJECTORY_FORMAT", "Trajectory"]

TRAJECTORY_FORMAT = "agentcompass.trajectory/1"


class Trajectory:
    """Events in order; ``messages()`` rebuilds the conversation from them."""

    def __init__(
        self,
        *,
        harness: str,
        model: str,
        endpoint: str | None,
        task_id: str,
        ledger: CallLedger | None = None,
        **header: Any,
    ) -> None:
        self.header: dict[str, Any] = {
            "harness": harness,
            "model": model,
            "endpoint": endpoint,
            "task_id": task_id,
            **header,
        }
        self.events: list[dict[str, Any]] = []
        self.ledger = ledger if ledger is not None else CallLedger()
        self.turns = 0
        self.stop_reason: str | None = None

    @property
    def usage(self) -> Usage:
        """The ledger's running totals (the same object: pricing it prices the ledger's)."""
        return self.ledger.usage

    def message(self, message: dict[str, Any]) -> None:
        """A message the harness wrote (system, user)."""
        self.events.append({"type": "message", "message": message})

    def model_call(self, reply: ChatReply) -> dict[str, Any]:
        """A completed chat completion; returns the assistant message for the conversation."""
        call = ModelCall(
            protocol="openai_chat",
            model=self.header["model"],
            latency=reply.latency,
            usage=reply.usage,
            finish_reason=reply.finish_reason,
            message=reply.message(),
        )
        self.record_call(call)
        assert call.message is not None
        return call.message

    def record_call(self, call: ModelCall) -> dict[str, Any]:
        """Record ``call`` in the ledger and as a ``model_call`` event; returns the event."""
        self.ledger.record(call)
        self.turns += 1
        event: dict[str, Any] = {
            "type": "model_call",
            "turn": self.turns,
            "latency_seconds": round(call.latency, 4),
            "usage": call.usage,
            "finish_reason": call.finish_reason,
        }
        if call.extra or call.protocol != "openai_chat" or not call.ok:
            # A call through the model gateway (or a failed one): what it was and how it went.
            event.update(protocol=call.protocol, model=call.model, status=call.status, stream=call.stream)
            event.update(call.extra)
            if not call.sent:
                event["sent"] = False
            for key in ("error", "request", "response"):
                if getattr(call, key) is not None:
                    event[key] = getattr(call, key)
        if call.message is not None:
            event["message"] = call.message
        self.events.append(event)
        return event

    def tool_result(self, message: dict[str, Any], **facts: Any) -> None:
        """A tool message fed back to the model; ``facts`` are the exec facts (exit code, duration, ...)."""
        self.events.append({"type": "tool_result", **facts, "message": message})

    def error(self, text: str) -> None:
        self.events.append({"type": "error", "error": text})

    def messages(self) -> list[dict[str, Any]]:
        return [event["message"] for event in self.events if "message" in event]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": TRAJECTORY_FORMAT,
            **self.header,
            "stop_reason": self.stop_reason,
            "turns": self.turns,
            "usage": self.usage.to_dict(),
            "events": self.events,
        }

    def tail(self, events: int = 6, width: int = 400) -> str:
        """The last ``events`` events as text, for a failed task's report."""
        lines: list[str] = []
        shown = self.events[-events:]
        if len(self.events) > len(shown):
            lines.append(f"... {len(self.events) - len(shown)} earlier event(s) in the trajectory file")
        for event in shown:
            kind = event["type"]
            if kind == "error":
                lines.append(f"[error] {_clip(event['error'], width)}")
                continue
            message = event.get("message") or {}
            if kind == "model_call":
                said = message.get("content") or ""
                if event.get("error"):
                    said = f"HTTP {event.get('status')}: {event['error']}"
                lines.append(f"[turn {event['turn']}] assistant: {_clip(str(said), width)}")
                for call in message.get("tool_calls", ()):
                    function = call["function"]
                    lines.append(f"    -> {function['name']}({_clip(function['arguments'], width)})")
            elif kind == "tool_result":
                lines.append(f"[tool] {_clip(message.get('content') or '', width)}")
            else:
                lines.append(f"[{message.get('role')}] {_clip(str(message.get('content') or ''), width)}")
        if self.stop_reason:
            lines.append(f"stopped: {self.stop_reason}")
        return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[:width] + f"... [{len(text) - width} more]"
