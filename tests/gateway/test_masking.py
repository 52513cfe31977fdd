"""The gateway never hands the real key (or another secret of the run) to the agent, even when the
upstream quotes it: a real aiohttp client on the agent's side, the scripted upstream on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from gateway_attempts import gateway_attempt

from pytest_agentcompass.gateway import GatewaySettings, Grant
from pytest_agentcompass.gateway.masking import SecretMask
from pytest_agentcompass.vocabulary.redact import add_runtime_secret

from model_upstream import ScriptedServer, Turn, scripted_server

aiohttp = pytest.importorskip("aiohttp")

KEY = "sk-upstream-echoed-key-8b3f2a61d0"
#: Another secret of the run (a runtime secret, such as an upstream header value), not the upstream's key.
OTHER = "org-secret-7e41c9d2b5a8"
#: A value of the config's ``${VAR}`` expansions, which the gateway is given.
CONFIG = "cfg-secret-52d8e0b1f4"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    add_runtime_secret(OTHER)
    with scripted_server(api_key=KEY) as running:
        yield running


def attempt(server: ScriptedServer) -> AbstractAsyncContextManager[Grant]:
    return gateway_attempt("m", GatewaySettings(base_url=server.base_url, api_key=KEY), secrets=(CONFIG,))


async def post(grant: Grant, **body: Any) -> tuple[int, dict[str, str], bytes]:
    """What an agent's client gets for a chat completion: status, headers, the whole body."""
    url = grant.base_url("openai_chat") + "/chat/completions"
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=payload, headers={"Authorization": f"Bearer {grant.token}"}) as reply,
    ):
        return reply.status, dict(reply.headers), await reply.read()


@pytest.mark.asyncio
async def test_an_upstream_error_that_quotes_the_key_reaches_the_agent_masked(server: ScriptedServer) -> None:
    echoed = {"x-echo-key": f"key={KEY}", "x-echo-other": OTHER, "x-echo-config": CONFIG}
    server.push(Turn(status=401, error=f"invalid x-api-key: {KEY} ({OTHER}, {CONFIG})", headers=echoed))
    async with attempt(server) as grant:
        status, headers, body = await post(grant)
    assert status == 401
    assert headers["x-echo-key"] == "key=***" and headers["x-echo-other"] == headers["x-echo-config"] == "***"
    assert b"invalid x-api-key: *** (***, ***)" in body
    (recorded,) = grant.calls
    assert KEY not in (recorded.error or "") and "***" in (recorded.error or "")


@pytest.mark.asyncio
async def test_a_streamed_answer_that_quotes_the_key_reaches_the_agent_masked(server: ScriptedServer) -> None:
    server.push(Turn(text=f"{KEY} {KEY}", headers={"x-echo-key": KEY}))  # streamed in two halves: a key each
    async with attempt(server) as grant:
        status, headers, body = await post(grant, stream=True)
    assert status == 200 and headers["x-echo-key"] == "***"
    assert KEY.encode() not in body and b"[DONE]" in body
    (recorded,) = grant.calls
    assert recorded.message is not None and recorded.message["content"] == "*** ***"


def test_a_secret_split_across_stream_chunks_is_masked_and_other_text_is_not_held() -> None:
    mask = SecretMask([KEY])
    pieces = [b'data: {"text": "see ', KEY[:5].encode(), KEY[5:20].encode(), KEY[20:].encode() + b'"}\n\n']
    sent = [mask.chunk(piece) for piece in pieces]
    assert b"".join(sent) + mask.flush() == b'data: {"text": "see ***"}\n\n'
    assert sent[-1].endswith(b"\n\n")  # an event's end is never held back
    assert mask.chunk(b"sk-") == b"" and mask.flush() == b"sk-"  # a stream that ends in a prefix loses nothing
    assert SecretMask([KEY]).chunk(b"plain text\n\n") == b"plain text\n\n"
