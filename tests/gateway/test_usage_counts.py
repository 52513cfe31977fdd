"""Every call the gateway sent upstream counts in ``usage.calls``, whatever its end; a call whose usage
never arrived is counted as such, not as zero tokens. A raw aiohttp client plays an agent that
hangs up (as ``curl -m 1`` does) on a scripted upstream on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager

import pytest
from gateway_attempts import gateway_attempt, until

from pytest_agentcompass import RunResult
from pytest_agentcompass.gateway import GatewaySettings, Grant
from pytest_agentcompass.models.ledger import CallLedger, ModelCall
from pytest_agentcompass.models.usage import format_usage, sum_usage

from model_upstream import ScriptedServer, Turn, scripted_server, stall, text

aiohttp = pytest.importorskip("aiohttp")

KEY = "sk-usage-upstream-key-3a9d0e71"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server(api_key=KEY) as running:
        yield running


def attempt(server: ScriptedServer) -> AbstractAsyncContextManager[Grant]:
    return gateway_attempt("m", GatewaySettings(base_url=server.base_url, api_key=KEY, max_total_tokens=1000))


async def read_first_chunk_and_hang_up(session: aiohttp.ClientSession, grant: Grant) -> None:
    url = grant.base_url("openai_chat") + "/chat/completions"
    async with session.post(url, json=BODY, headers={"Authorization": f"Bearer {grant.token}"}) as reply:
        assert reply.status == 200
        await reply.content.readline()
    # leaving the block before the body ended closes the connection: the agent hung up


async def whole(session: aiohttp.ClientSession, grant: Grant) -> int:
    url = grant.base_url("openai_chat") + "/chat/completions"
    async with session.post(url, json=BODY, headers={"Authorization": f"Bearer {grant.token}"}) as reply:
        await reply.read()
        return reply.status


@pytest.mark.asyncio
async def test_calls_the_agent_hung_up_on_count_and_their_unknown_usage_is_said(server: ScriptedServer) -> None:
    gate = threading.Event()
    server.push(
        text("done", prompt_tokens=10, completion_tokens=5),
        stall(text("never finished")),
        Turn(status=500, error="overloaded"),
        Turn(text="held back", gate=gate),
    )
    try:
        async with attempt(server) as grant, aiohttp.ClientSession() as session:
            assert await whole(session, grant) == 200
            await read_first_chunk_and_hang_up(session, grant)
            await until(lambda: len(grant.calls) == 2)
            assert await whole(session, grant) == 500
            waiting = asyncio.ensure_future(whole(session, grant))  # no answer yet: the agent gives up
            await until(lambda: len(server.requests) == 4)
            waiting.cancel()
            await until(lambda: len(grant.calls) == 4)
    finally:
        gate.set()
    assert len(server.requests) == 4  # the upstream served four calls
    usage = grant.usage()
    assert usage.calls == 4 and usage.calls_without_usage == 2  # the stalled one, the one never answered
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (10, 5, 15)
    metadata = grant.finish(RunResult("task-1")).metadata
    assert metadata["usage"]["calls"] == 4 and metadata["usage"]["calls_without_usage"] == 2
    assert "2 call(s) with unknown usage" in metadata["usage_note"] and "token budget" in metadata["usage_note"]
    totals = sum_usage([metadata["usage"], {"calls": 1, "prompt_tokens": 1, "completion_tokens": 1}])
    assert totals is not None and totals["calls"] == 5 and totals["calls_without_usage"] == 2
    assert "2 call(s) with unknown usage" in format_usage(totals)


def test_a_call_whose_usage_arrived_before_it_failed_counts_with_its_tokens() -> None:
    ledger = CallLedger()
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    ledger.record(ModelCall("openai_chat", "m", status=200, usage=usage, error="the agent hung up before the end"))
    ledger.record(ModelCall("openai_chat", "m", status=401, error="invalid key"))  # an error answer: no usage due
    ledger.record(ModelCall("openai_chat", "m", status=403, sent=False, error="budget spent"))  # never sent
    assert ledger.usage.to_dict() == {"calls": 2, "prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
