"""A :class:`~model_script.Turn` rendered in each of the four model APIs: whole answers, their
streamed events, errors, and the token usage the server reports in them."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from model_script import Turn

__all__ = ["error_body", "render", "reported_counts", "stream_events"]

#: Ids of answers and tool calls, unique in the process.
_ids = itertools.count(1)


def _usage(protocol: str, turn: Turn) -> dict[str, int]:
    p, c = turn.prompt_tokens, turn.completion_tokens
    if protocol == "openai_chat":
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if protocol == "openai_responses":
        return {
            "input_tokens": p,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c,
        }
    if protocol == "anthropic":
        return {"input_tokens": p, "output_tokens": c}
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c}


def error_body(protocol: str, status: int, message: str, kind: str = "server_error") -> dict[str, Any]:
    """The error body each API sends with an HTTP error status."""
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    if protocol == "gemini":
        return {"error": {"code": status, "message": message, "status": kind.upper()}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _chat_message(turn: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{next(_ids)}", "type": "function", "function": {"name": t.name, "arguments": t.json_text()}}
            for t in turn.tool_calls
        ]
    return message


def _responses_items(turn: Turn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if turn.text is not None:
        items.append(
            {
                "type": "message",
                "id": f"msg_{next(_ids)}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": turn.text, "annotations": [], "logprobs": []}],
            }
        )
    for call in turn.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{next(_ids)}",
                "call_id": f"call_{next(_ids)}",
                "name": call.name,
                "arguments": call.json_text(),
                "status": "completed",
            }
        )
    return items


def _response_object(model: str, status: str, output: list[Any], usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": f"resp_{next(_ids)}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "usage": usage,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": 1.0,
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
    }


def _anthropic_blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.text is not None:
        blocks.append({"type": "text", "text": turn.text})
    for call in turn.tool_calls:
        blocks.append({"type": "tool_use", "id": f"toolu_{next(_ids)}", "name": call.name, "input": call.json_value()})
    return blocks


def _gemini_parts(turn: Turn) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if turn.text is not None:
        parts.append({"text": turn.text})
    parts.extend({"functionCall": {"name": c.name, "args": c.json_value()}} for c in turn.tool_calls)
    return parts


def render(protocol: str, turn: Turn, model: str) -> dict[str, Any]:
    """The non-streamed answer of ``turn``."""
    usage = _usage(protocol, turn)
    if protocol == "openai_chat":
        return {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": _chat_message(turn),
                    "finish_reason": turn.finish("openai_chat"),
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    if protocol == "openai_responses":
        return _response_object(model, "completed", _responses_items(turn), usage)
    if protocol == "anthropic":
        return {
            "id": f"msg_{next(_ids)}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": _anthropic_blocks(turn),
            "stop_reason": turn.finish("anthropic"),
            "stop_sequence": None,
            "usage": usage,
        }
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": _gemini_parts(turn)},
                "finishReason": turn.finish("gemini"),
                "index": 0,
            }
        ],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": f"gem-{next(_ids)}",
    }


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def stream_events(protocol: str, turn: Turn, model: str, include_usage: bool) -> list[bytes]:
    """The streamed answer of ``turn``: SSE frames in the order the API sends them."""
    if protocol == "openai_chat":
        return _chat_stream(turn, model, include_usage)
    if protocol == "openai_responses":
        return _responses_stream(turn, model)
    if protocol == "anthropic":
        return _anthropic_stream(turn, model)
    return _gemini_stream(turn, model)


def _chat_stream(turn: Turn, model: str, include_usage: bool) -> list[bytes]:
    base = {"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    frames = [chunk({"role": "assistant", "content": ""})]
    if turn.text:
        half = len(turn.text) // 2
        frames += [chunk({"content": turn.text[:half]}), chunk({"content": turn.text[half:]})]
    for index, call in enumerate(turn.tool_calls):
        args = call.json_text()
        head = {"index": index, "id": f"call_{next(_ids)}", "type": "function"}
        frames.append(chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}))
        for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
            frames.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    frames.append(chunk({}, turn.finish("openai_chat")))
    if include_usage:
        frames.append(_sse({**base, "choices": [], "usage": _usage("openai_chat", turn)}))
    frames.append(_sse("[DONE]"))
    return frames


def _responses_stream(turn: Turn, model: str) -> list[bytes]:
    seq = itertools.count()
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append(_sse({"type": kind, "sequence_number": next(seq), **fields}, kind))

    final = _response_object(model, "completed", _responses_items(turn), _usage("openai_responses", turn))
    start = {**final, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            opening = {**item, "status": "in_progress", "content": []}
            emit("response.output_item.added", output_index=index, item=opening)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            emit("response.content_part.added", **ids, part=part)
            full = item["content"][0]["text"]
            for piece in (full[: len(full) // 2], full[len(full) // 2 :]):
                emit("response.output_text.delta", **ids, delta=piece, logprobs=[])
            emit("response.output_text.done", **ids, text=full, logprobs=[])
            emit("response.content_part.done", **ids, part={**part, "text": full})
        else:
            opening = {**item, "status": "in_progress", "arguments": ""}
            emit("response.output_item.added", output_index=index, item=opening)
            args = item["arguments"]
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                emit("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
            emit("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=args)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response={**final, "created_at": start["created_at"], "id": start["id"]})
    return frames


def _anthropic_stream(turn: Turn, model: str) -> list[bytes]:
    frames: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        frames.append(_sse({"type": kind, **fields}, kind))

    message = render("anthropic", turn, model)
    usage = {"input_tokens": turn.prompt_tokens, "output_tokens": 1}
    start = {**message, "content": [], "stop_reason": None, "usage": usage}
    emit("message_start", message=start)
    emit("ping")
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            full = block["text"]
            for piece in (full[: len(full) // 2], full[len(full) // 2 :]):
                emit("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
        else:
            emit("content_block_start", index=index, content_block={**block, "input": {}})
            args = json.dumps(block["input"])
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                emit("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece})
        emit("content_block_stop", index=index)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    emit("message_delta", delta=delta, usage={"output_tokens": turn.completion_tokens})
    emit("message_stop")
    return frames


def _gemini_stream(turn: Turn, model: str) -> list[bytes]:
    parts = _gemini_parts(turn) or [{"text": ""}]
    frames = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        # Every chunk carries the usage so far (the last one the totals), as the API sends it.
        done = turn.completion_tokens if last else min(index + 1, turn.completion_tokens)
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        if last:
            candidate["finishReason"] = turn.finish("gemini")
        usage = {"promptTokenCount": turn.prompt_tokens, "candidatesTokenCount": done}
        usage["totalTokenCount"] = turn.prompt_tokens + done
        frames.append(_sse({"candidates": [candidate], "usageMetadata": usage, "modelVersion": model}))
    return frames


def reported_counts(protocol: str, turn: Turn, *, streamed: bool, include_usage: bool) -> dict[str, int] | None:
    """What the answer of ``turn`` told the client it used (``None``: no usage was sent)."""
    if turn.status >= 400 or turn.body is not None:
        return None
    if protocol == "openai_chat" and streamed and not include_usage:
        return None
    p, c = turn.prompt_tokens, turn.completion_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
