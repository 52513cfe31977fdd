"""The script of the scripted model server (``model_upstream``): protocol-neutral answers.

A :class:`Turn` is text, tool calls (a name and JSON arguments), an HTTP
error, garbage, a delay or a stall mid-stream; :class:`Seen` is what a
request showed, whatever its protocol (``responder(seen)`` answers from it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PROTOCOLS", "Seen", "ToolUse", "Turn", "garbage", "stall", "text", "tool"]

PROTOCOLS = ("openai_chat", "openai_responses", "anthropic", "gemini")


@dataclass
class ToolUse:
    """One tool call: ``arguments`` is a JSON value, or a string sent as it is (to send malformed JSON)."""

    name: str
    arguments: Any = field(default_factory=dict)

    def json_text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)

    def json_value(self) -> Any:
        if not isinstance(self.arguments, str):
            return self.arguments
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return {"unparsed": self.arguments}


@dataclass
class Turn:
    """One scripted answer, rendered in the request's protocol.

    ``status >= 400`` answers the protocol's error body with ``error`` as its
    message; ``body`` (bytes or a JSON value) is sent as it is instead of
    anything rendered (garbage, or a protocol's own raw JSON). ``delay`` holds
    the answer back (a client hang-up meanwhile counts in ``aborted``);
    ``stall`` streams the first event, then holds until the client hangs up;
    ``linger`` streams every event, then holds the body open until the client
    hangs up (an upstream that ends its body late: the agent closes first);
    ``gate`` holds the answer until the test sets it. ``cut``: the model stopped at its
    token limit (``finish_reason`` length, ``max_tokens``, ``MAX_TOKENS``).
    """

    text: str | None = None
    tool_calls: list[ToolUse] = field(default_factory=list)
    status: int = 200
    error: str | None = None
    error_type: str = "server_error"
    body: Any = None
    content_type: str = "application/json"
    delay: float = 0.0
    stall: bool = False
    linger: bool = False
    #: Held until this event is set (then answered), for tests that need calls in flight at once.
    gate: threading.Event | None = None
    prompt_tokens: int = 10
    completion_tokens: int = 5
    headers: dict[str, str] = field(default_factory=dict)
    cut: bool = False

    def finish(self, protocol: str) -> str:
        """Why the model stopped, in ``protocol``'s words."""
        words = {
            "openai_chat": ("length", "tool_calls", "stop"),
            "anthropic": ("max_tokens", "tool_use", "end_turn"),
            "gemini": ("MAX_TOKENS", "STOP", "STOP"),
        }[protocol]
        return words[0] if self.cut else words[1] if self.tool_calls else words[2]


def text(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5, delay: float = 0.0) -> Turn:
    """An assistant answer without tool calls."""
    return Turn(text=content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, delay=delay)


def tool(name: str, arguments: Any = None, *, content: str | None = None, **counts: int) -> Turn:
    """An assistant turn with one tool call (``arguments``: a JSON value, or raw text)."""
    return Turn(text=content, tool_calls=[ToolUse(name, {} if arguments is None else arguments)], **counts)


def garbage(data: bytes = b"<html>502 Bad Gateway</html>", status: int = 502) -> Turn:
    """A body that is no protocol's JSON."""
    return Turn(status=status, body=data, content_type="text/html")


def stall(then: Turn | None = None) -> Turn:
    """A streamed answer that stops after its first event and holds until the client hangs up."""
    turn = then or text("never finished")
    turn.stall = True
    return turn


@dataclass
class Seen:
    """A request as a responder sees it, whatever its protocol."""

    protocol: str
    path: str
    headers: dict[str, str]
    body: Any
    model: str | None
    stream: bool

    def tools(self) -> list[str]:
        """The names of the tools the request offers."""
        names: list[str] = []
        for entry in self.body.get("tools") or [] if isinstance(self.body, dict) else []:
            if not isinstance(entry, dict):
                continue
            if self.protocol == "gemini":
                names.extend(d.get("name", "") for d in entry.get("functionDeclarations") or [])
            elif isinstance(entry.get("function"), dict):  # chat completions
                names.append(entry["function"].get("name", ""))
            elif "name" in entry:  # Responses, Anthropic
                names.append(entry["name"])
        return names

    def tool_results(self) -> int:
        """How many tool results the conversation holds."""
        return sum(1 for kind in _walk_kinds(self.body) if kind in _RESULT_KINDS)

    def text(self) -> str:
        """Every string of the request body, joined (to find a task's instruction)."""
        return "\n".join(_strings(self.body))


_RESULT_KINDS = {"role:tool", "type:function_call_output", "type:tool_result", "key:functionResponse"}


def _walk_kinds(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if value.get("role") == "tool":
            yield "role:tool"
        if isinstance(value.get("type"), str):
            yield f"type:{value['type']}"
        if "functionResponse" in value:
            yield "key:functionResponse"
        for item in value.values():
            yield from _walk_kinds(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk_kinds(item)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
