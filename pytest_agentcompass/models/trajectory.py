"""The record of one agent run: every message, model call and tool result, in order.

Written as ``trajectory.json`` next to the task's detail (see docs/api.md for
the format). The same record renders the last turns shown with a failed
task's pytest report.
"""

from __future__ import annotations

from typing import Any

from .reply import ChatReply
from .usage import Usage

__all__ = ["TRAJECTORY_FORMAT", "Trajectory"]

TRAJECTORY_FORMAT = "agentcompass.trajectory/1"


class Trajectory:
    """Events in order; ``messages()`` rebuilds the conversation from them."""

    def __init__(self, *, harness: str, model: str, endpoint: str, task_id: str) -> None:
        self.header: dict[str, Any] = {"harness": harness, "model": model, "endpoint": endpoint, "task_id": task_id}
        self.events: list[dict[str, Any]] = []
        self.usage = Usage()
        self.turns = 0
        self.stop_reason: str | None = None

    def message(self, message: dict[str, Any]) -> None:
        """A message the harness wrote (system, user)."""
        self.events.append({"type": "message", "message": message})

    def model_call(self, reply: ChatReply) -> dict[str, Any]:
        """A completed model call; returns the assistant message for the conversation."""
        self.turns += 1
        counts = reply.usage
        if counts is not None:
            self.usage.add_call(counts["prompt_tokens"], counts["completion_tokens"], counts["total_tokens"])
        else:
            self.usage.calls += 1
        message = reply.message()
        self.events.append(
            {
                "type": "model_call",
                "turn": self.turns,
                "latency_seconds": round(reply.latency, 4),
                "usage": reply.usage,
                "finish_reason": reply.finish_reason,
                "message": message,
            }
        )
        return message

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
            message = event["message"]
            if kind == "model_call":
                lines.append(f"[turn {event['turn']}] assistant: {_clip(message.get('content') or '', width)}")
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
