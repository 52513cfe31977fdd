"""The gateway's reading of answers: usage and the assistant message from each API's frames,
however the bytes are cut (the scripted server renders the frames as each API sends them)."""

from __future__ import annotations

import json

import pytest

from pytest_agentcompass.gateway.reading import AnswerReader, SSEParser

from model_rendering import render, stream_events
from model_script import PROTOCOLS, tool

TURN = tool("search", {"query": "größe", "limit": 3}, content="Looking it up.", prompt_tokens=321, completion_tokens=54)
USAGE = {"prompt_tokens": 321, "completion_tokens": 54, "total_tokens": 375}


def expected_message(reader: AnswerReader) -> None:
    message = reader.message()
    assert message is not None and message["content"] == "Looking it up."
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "search"
    assert json.loads(call["function"]["arguments"]) == {"query": "größe", "limit": 3}


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_stream_fed_byte_by_byte_gives_the_final_usage_and_the_answer(protocol: str, crlf: bool) -> None:
    stream = b"".join(stream_events(protocol, TURN, "m", include_usage=True))
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    parser, reader = SSEParser(), AnswerReader(protocol)  # type: ignore[arg-type]
    for index in range(len(stream)):
        for name, data in parser.feed(stream[index : index + 1]):
            reader.event(name, json.loads(data) if data != "[DONE]" else None)
    assert reader.usage == USAGE  # Gemini's cumulative counts: the last, not their sum
    expected_message(reader)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_whole_answer_gives_its_usage_and_the_answer(protocol: str) -> None:
    reader = AnswerReader(protocol)  # type: ignore[arg-type]
    reader.body(render(protocol, TURN, "m"))
    assert reader.usage == USAGE
    expected_message(reader)


def test_anthropic_cache_tokens_count_as_prompt_tokens() -> None:
    reader = AnswerReader("anthropic")
    start = {"input_tokens": 5, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000, "output_tokens": 1}
    reader.event("message_start", {"type": "message_start", "message": {"usage": start}})
    reader.event("message_delta", {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 42}})
    assert reader.usage == {"prompt_tokens": 1105, "completion_tokens": 42, "total_tokens": 1147, "cached_tokens": 1000}
