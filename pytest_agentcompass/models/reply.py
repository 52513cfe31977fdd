"""One chat completion as the harnesses use it, read from whatever the endpoint sent.

The client hands over the answer as it parsed it: its own objects, a plain
dict or list where the JSON was of another shape, or the text of a body that
was no JSON at all. :func:`parse_reply` reads the first choice field by
field and says exactly what is missing or of the wrong type, so a garbled
answer is one line about the server, never an ``AttributeError`` of ours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatReply", "ReplyShapeError", "ToolCall", "parse_reply"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it; may be malformed

    def to_message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ChatReply:
    """The first choice of one chat completion, with its usage and latency."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    latency: float = 0.0

    def message(self) -> dict[str, Any]:
        """The assistant message as it goes back into the conversation."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return out


class ReplyShapeError(Exception):
    """What makes a parsed answer no chat completion (its message says what, for one line)."""


def _field(value: Any, name: str, where: str) -> Any:
    """``value.name``, whatever the client made of the JSON (an object, or a dict it did not convert)."""
    if isinstance(value, Mapping):
        return value.get(name)
    if isinstance(value, str | bytes | int | float | list | tuple) or value is None:
        raise ReplyShapeError(f"{where} is {_kind(value)}, not an object")
    return getattr(value, name, None)


def _kind(value: Any) -> str:
    if value is None:
        return "missing"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def parse_reply(response: Any, latency: float = 0.0) -> ChatReply:
    """The reply in ``response``; :raises ReplyShapeError: when it is no chat completion."""
    if isinstance(response, str | bytes):
        raise ReplyShapeError("it is text, not JSON")  # the client returns a body it cannot parse as it is
    choices = _field(response, "choices", "the answer")
    if not isinstance(choices, list | tuple) or not choices:
        raise ReplyShapeError(f"choices is {_kind(choices) if choices != [] else 'empty'}, not a list of choices")
    choice = choices[0]
    message = _field(choice, "message", "choices[0]")
    content = _field(message, "content", "choices[0].message")
    if content is not None and not isinstance(content, str):
        raise ReplyShapeError(f"choices[0].message.content is {_kind(content)}, not text")
    calls = [_tool_call(call, index) for index, call in enumerate(_list(message, "tool_calls", "choices[0].message"))]
    finish = _field(choice, "finish_reason", "choices[0]")
    return ChatReply(
        content=content,
        tool_calls=[call for call in calls if call is not None],
        finish_reason=finish if isinstance(finish, str) else None,
        usage=_usage(_field(response, "usage", "the answer")),
        latency=latency,
    )


def _list(value: Any, name: str, where: str) -> list[Any] | tuple[Any, ...]:
    items = _field(value, name, where) or []
    if not isinstance(items, list | tuple):
        raise ReplyShapeError(f"{where}.{name} is {_kind(items)}, not a list")
    return items


def _tool_call(call: Any, index: int) -> ToolCall | None:
    where = f"choices[0].message.tool_calls[{index}]"
    function = _field(call, "function", where)
    if function is None:
        return None  # a non-function tool type: the agent offered none
    name = _field(function, "name", f"{where}.function")
    arguments = _field(function, "arguments", f"{where}.function")
    if not isinstance(name, str) or not isinstance(arguments, str | None):
        raise ReplyShapeError(f"{where}.function has no name, or arguments that are not text")
    return ToolCall(id=str(_field(call, "id", where)), name=name, arguments=arguments or "")


def _usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    try:
        prompt = int(_field(usage, "prompt_tokens", "usage") or 0)
        completion = int(_field(usage, "completion_tokens", "usage") or 0)
        total = _field(usage, "total_tokens", "usage")
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": int(total) if total is not None else prompt + completion,
        }
    except (TypeError, ValueError):
        raise ReplyShapeError("usage holds counts that are not numbers") from None
