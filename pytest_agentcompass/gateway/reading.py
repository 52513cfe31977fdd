"""What the gateway reads on the way out: the usage and the answer of each call.

The answer is forwarded byte for byte; a copy goes through a reader that
keeps the final usage (each API reports it in its own frames: OpenAI chat in
the last chunk, Responses in ``response.completed``, Anthropic split over
``message_start`` and ``message_delta``, Gemini cumulatively in every chunk)
and rebuilds the answer as one assistant message in chat-completions form,
for the trajectory.
"""

from __future__ import annotations

import json
from typing import Any

from ..models.ledger import Protocol

__all__ = ["AnswerReader", "SSEParser", "error_message"]


class SSEParser:
    """Server-sent events from bytes that arrive in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        """The complete events in ``chunk`` (and what came before): ``(event name, data)``."""
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        if self._buffer.endswith(b"\r"):  # maybe half of a CRLF: decide with the next piece
            ready, self._buffer = self._buffer[:-1], b"\r"
        else:
            ready, self._buffer = self._buffer, b""
        *blocks, rest = ready.replace(b"\r", b"\n").split(b"\n\n")
        self._buffer = rest + self._buffer
        events = []
        for block in blocks:
            name: str | None = None
            data: list[str] = []
            for line in block.decode("utf-8", "replace").split("\n"):
                if line.startswith(":"):
                    continue
                key, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if key == "event":
                    name = value
                elif key == "data":
                    data.append(value)
            if data:
                events.append((name, "\n".join(data)))
        return events


def error_message(body: bytes, limit: int = 500) -> str:
    """The message of an error answer (its ``error.message`` when it has one), short."""
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        value = None
    if isinstance(value, list) and value:  # Gemini's JSON-array answers
        value = value[0]
    if isinstance(value, dict):
        inner = value.get("error", value)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])[:limit]
    text = body.decode("utf-8", "replace").strip()
    return text[:limit] + ("..." if len(text) > limit else "") if text else "(empty body)"


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


class AnswerReader:
    """Usage, finish reason and the assistant message of one answer, fed JSON bodies or SSE events."""

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self.usage: dict[str, int] | None = None
        self.finish_reason: str | None = None
        self.text: list[str] = []
        #: Tool calls by position: id, name and the argument text so far.
        self.calls: dict[int, dict[str, str]] = {}
        self.events = 0
        #: The answer's last event was read (and so sent on): an agent that hangs up now has all of it.
        self.complete = False

    # -- input ---------------------------------------------------------------
    def body(self, value: Any) -> None:
        """A whole (non-streamed) answer."""
        if self.protocol == "gemini" and isinstance(value, list):  # a stream answered as one JSON array
            for chunk in value:
                self.event(None, chunk)
            return
        if not isinstance(value, dict):
            return
        if self.protocol == "openai_chat":
            self._chat_usage(value.get("usage"))
            choices = value.get("choices") or []
            if choices and isinstance(choices[0], dict):
                message = choices[0].get("message") or {}
                self.finish_reason = choices[0].get("finish_reason")
                if isinstance(message.get("content"), str):
                    self.text.append(message["content"])
                for index, call in enumerate(message.get("tool_calls") or []):
                    function = call.get("function") or {}
                    self._call(index, call.get("id"), function.get("name"), function.get("arguments"))
        elif self.protocol == "openai_responses":
            self._response(value)
        elif self.protocol == "anthropic":
            self._anthropic_usage(value.get("usage"))
            self.finish_reason = value.get("stop_reason")
            for index, block in enumerate(value.get("content") or []):
                self._anthropic_block(index, block)
        else:
            self._gemini_chunk(value)

    def event(self, name: str | None, data: Any) -> None:
        """One streamed event (its ``data`` parsed as JSON when it was JSON, else its text)."""
        self.events += 1
        if self.protocol == "openai_chat" and data == "[DONE]":
            self.complete = True
        if not isinstance(data, dict):
            return
        if self.protocol == "openai_chat":
            self._chat_chunk(data)
        elif self.protocol == "openai_responses":
            if str(data.get("type", name)) in ("response.completed", "response.failed", "response.incomplete"):
                self.complete = True
                response = data.get("response")
                if isinstance(response, dict):
                    self._response(response)
        elif self.protocol == "anthropic":
            self.complete = self.complete or data.get("type") == "message_stop"
            self._anthropic_event(data)
        else:
            self._gemini_chunk(data)
            # No end event in the Gemini API: its last chunk is the one with a finish reason.
            self.complete = self.finish_reason is not None

    # -- output ----------------------------------------------------------------
    def message(self) -> dict[str, Any] | None:
        """The answer as an assistant message (chat-completions form), ``None`` when nothing was read."""
        if not self.text and not self.calls:
            return None
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) or None}
        if self.calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.calls.items())
            ]
        return message

    # -- per API -----------------------------------------------------------------
    def _call(self, index: int, call_id: Any, name: Any, arguments: Any) -> None:
        call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if call_id:
            call["id"] = str(call_id)
        if name:
            call["name"] = str(name)
        if arguments:
            call["arguments"] += arguments if isinstance(arguments, str) else json.dumps(arguments)

    def _set_usage(self, prompt: int, completion: int, total: int | None = None, **extra: int) -> None:
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total or prompt + completion}
        usage.update({k: v for k, v in extra.items() if v})
        self.usage = usage

    def _chat_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            details = usage.get("completion_tokens_details") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            self._set_usage(
                _int(usage.get("prompt_tokens")),
                _int(usage.get("completion_tokens")),
                _int(usage.get("total_tokens")),
                cached_tokens=_int(cached),
                reasoning_tokens=_int(details.get("reasoning_tokens") if isinstance(details, dict) else 0),
            )

    def _chat_chunk(self, chunk: dict[str, Any]) -> None:
        self._chat_usage(chunk.get("usage"))
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                self._call(_int(call.get("index")), call.get("id"), function.get("name"), function.get("arguments"))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _response(self, response: dict[str, Any]) -> None:
        usage = response.get("usage")
        if isinstance(usage, dict):
            self._set_usage(
                _int(usage.get("input_tokens")),
                _int(usage.get("output_tokens")),
                _int(usage.get("total_tokens")),
                cached_tokens=_int((usage.get("input_tokens_details") or {}).get("cached_tokens")),
                reasoning_tokens=_int((usage.get("output_tokens_details") or {}).get("reasoning_tokens")),
            )
        self.finish_reason = response.get("status")
        self.text, self.calls = [], {}
        for item in response.get("output") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                for part in item.get("content") or []:
                    if isinstance(part, dict) and part.get("type") == "output_text":
                        self.text.append(str(part.get("text", "")))
            elif item.get("type") == "function_call":
                self._call(len(self.calls), item.get("call_id"), item.get("name"), item.get("arguments"))

    def _anthropic_usage(self, usage: Any, start: bool = True) -> None:
        if not isinstance(usage, dict):
            return
        known = self.usage or {}
        cached = _int(usage.get("cache_read_input_tokens")) or known.get("cached_tokens", 0)
        if start or "input_tokens" in usage:
            prompt = _int(usage.get("input_tokens")) + _int(usage.get("cache_creation_input_tokens")) + cached
        else:
            prompt = known.get("prompt_tokens", 0)
        completion = _int(usage.get("output_tokens")) if "output_tokens" in usage else known.get("completion_tokens", 0)
        self._set_usage(prompt, completion, cached_tokens=cached)

    def _anthropic_block(self, index: int, block: Any) -> None:
        if not isinstance(block, dict):
            return
        if block.get("type") == "text":
            self.text.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            arguments = block.get("input")
            self._call(index, block.get("id"), block.get("name"), arguments if arguments else "")

    def _anthropic_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._anthropic_usage(message.get("usage"))
        elif kind == "content_block_start":
            self._anthropic_block(_int(event.get("index")), event.get("content_block"))
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                self.text.append(str(delta.get("text", "")))
            elif delta.get("type") == "input_json_delta":
                self._call(_int(event.get("index")), None, None, delta.get("partial_json"))
        elif kind == "message_delta":
            self._anthropic_usage(event.get("usage"), start=False)
            self.finish_reason = (event.get("delta") or {}).get("stop_reason") or self.finish_reason

    def _gemini_chunk(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usageMetadata")
        if isinstance(usage, dict):  # cumulative: the last one holds the totals
            completion = _int(usage.get("candidatesTokenCount")) + _int(usage.get("thoughtsTokenCount"))
            prompt = _int(usage.get("promptTokenCount")) + _int(usage.get("toolUsePromptTokenCount"))
            self._set_usage(
                prompt,
                completion,
                _int(usage.get("totalTokenCount")),
                cached_tokens=_int(usage.get("cachedContentTokenCount")),
                reasoning_tokens=_int(usage.get("thoughtsTokenCount")),
            )
        candidates = chunk.get("candidates") or []
        if not candidates or not isinstance(candidates[0], dict):
            return
        candidate = candidates[0]
        self.finish_reason = candidate.get("finishReason") or self.finish_reason
        for part in (candidate.get("content") or {}).get("parts") or []:
            if not isinstance(part, dict) or part.get("thought"):
                continue
            if isinstance(part.get("text"), str):
                self.text.append(part["text"])
            call = part.get("functionCall")
            if isinstance(call, dict):
                index = len(self.calls)
                self._call(index, call.get("id") or f"call_{index}", call.get("name"), call.get("args"))
