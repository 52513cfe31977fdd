"""The model gateway between the official clients and the scripted upstream, on loopback.

Real parts only: the gateway's aiohttp server, the scripted model server
(which refuses any key but the real one), and the official ``openai``,
``anthropic`` and ``google-genai`` clients, streaming and not.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from gateway_attempts import gateway_attempt, until

from pytest_agentcompass import EnvironmentSpec, RunResult, RunStatus
from pytest_agentcompass.environments.local import LocalEnvironment
from pytest_agentcompass.gateway import GatewaySettings, Grant, ModelGateway

from model_upstream import ScriptedServer, Turn, cutting_upstream, garbage, scripted_server, stall, text, tool

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
genai = pytest.importorskip("google.genai")
pytest.importorskip("aiohttp")

#: google-genai subclasses aiohttp's ClientSession, which aiohttp discourages: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")

KEY = "sk-upstream-real-key-4d7c1e9a"
MODEL = "pinned-model"
PROTOCOLS = ["openai_chat", "openai_responses", "anthropic", "gemini"]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server(api_key=KEY) as running:
        yield running


def settings(server: ScriptedServer, **extra: Any) -> GatewaySettings:
    urls = {"base_url": server.base_url, "anthropic_base_url": server.root_url, "gemini_base_url": server.root_url}
    return GatewaySettings(**{**urls, "api_key": KEY, **extra})


def attempt(server: ScriptedServer, **extra: Any) -> AbstractAsyncContextManager[Grant]:
    return gateway_attempt(MODEL, settings(server, **extra))


# -- one call in each API, through the official client ------------------------------------
async def call(protocol: str, grant: Grant, stream: bool, asked: str = "asked-model") -> tuple[str, list[Any]]:
    """One call with ``protocol``'s official client: ``(text, [(tool name, arguments)])`` as it parsed them."""
    prompt = "list the files"
    if protocol.startswith("openai"):
        client = openai.AsyncOpenAI(api_key=grant.token, base_url=grant.base_url(protocol), max_retries=0)
        try:
            if protocol == "openai_chat":
                return await _chat(client, asked, prompt, stream)
            if stream:
                async with client.responses.stream(model=asked, input=prompt) as events:
                    response = await events.get_final_response()
            else:
                response = await client.responses.create(model=asked, input=prompt)
            calls = [(o.name, json.loads(o.arguments)) for o in response.output if o.type == "function_call"]
            return response.output_text, calls
        finally:
            await client.close()
    if protocol == "anthropic":
        claude = anthropic.AsyncAnthropic(api_key=grant.token, base_url=grant.base_url("anthropic"), max_retries=0)
        try:
            request = {"model": asked, "max_tokens": 100, "messages": [{"role": "user", "content": prompt}]}
            if stream:
                async with claude.messages.stream(**request) as events:
                    message = await events.get_final_message()
            else:
                message = await claude.messages.create(**request)
            said = "".join(b.text for b in message.content if b.type == "text")
            return said, [(b.name, b.input) for b in message.content if b.type == "tool_use"]
        finally:
            await claude.close()
    options = genai.types.HttpOptions(base_url=grant.base_url("gemini"), retry_options=None)
    gemini = genai.Client(api_key=grant.token, http_options=options)
    try:
        chunks = (
            [c async for c in await gemini.aio.models.generate_content_stream(model=asked, contents=prompt)]
            if stream
            else [await gemini.aio.models.generate_content(model=asked, contents=prompt)]
        )
    finally:
        await gemini.aio.aclose()
    said = "".join(p.text for c in chunks for p in c.candidates[0].content.parts if p.text)
    return said, [(f.name, f.args) for c in chunks for f in c.function_calls or []]


async def _chat(client: Any, model: str, prompt: str, stream: bool) -> tuple[str, list[Any]]:
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        reply = await client.chat.completions.create(model=model, messages=messages)
        message = reply.choices[0].message
        return message.content or "", [
            (c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
        ]
    said, name, args = "", "", ""
    async for chunk in await client.chat.completions.create(model=model, messages=messages, stream=True):
        for choice in chunk.choices:
            said += choice.delta.content or ""
            for piece in choice.delta.tool_calls or []:
                name += piece.function.name or ""
                args += piece.function.arguments or ""
    return said, [(name, json.loads(args))] if name else []


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_each_api_passes_through_with_the_real_key_and_is_counted(
    server: ScriptedServer, protocol: str, stream: bool
) -> None:
    server.push(
        tool("run_shell", {"command": "ls -la"}, content="Let me look.", prompt_tokens=123, completion_tokens=45)
    )
    async with attempt(server) as grant:
        said, calls = await call(protocol, grant, stream)
    assert said == "Let me look." and calls == [("run_shell", {"command": "ls -la"})]
    (seen,) = server.requests
    assert seen["protocol"] == protocol
    assert grant.token not in json.dumps(seen["headers"])  # the upstream answered: it got the real key
    assert seen["body"].get("model", MODEL) == MODEL and "asked-model" not in seen["path"]  # pinned
    (recorded,) = grant.calls
    usage = {"prompt_tokens": 123, "completion_tokens": 45, "total_tokens": 168}
    assert (recorded.protocol, recorded.status, recorded.stream, recorded.usage) == (protocol, 200, stream, usage)
    assert recorded.message is not None and recorded.message["content"] == "Let me look."
    (function,) = [c["function"] for c in recorded.message["tool_calls"]]
    assert function["name"] == "run_shell" and json.loads(function["arguments"]) == {"command": "ls -la"}
    assert recorded.extra["requested_model"] == "asked-model"
    assert grant.usage().to_dict() == server.reported()


@pytest.mark.asyncio
async def test_an_attempt_s_usage_is_what_the_upstream_reported_over_every_api(server: ScriptedServer) -> None:
    async with attempt(server, input_price_per_million=1.0, output_price_per_million=4.0) as grant:
        for index, protocol in enumerate(PROTOCOLS * 2):
            server.push(text(f"answer {index}", prompt_tokens=100 + index, completion_tokens=10 + index))
            said, _ = await call(protocol, grant, stream=index % 2 == 1)
            assert said == f"answer {index}"
    totals = server.reported()
    assert totals["calls"] == 8
    usage = grant.usage().to_dict()
    assert {k: usage[k] for k in totals} == totals
    assert usage["cost"] == round((totals["prompt_tokens"] * 1.0 + totals["completion_tokens"] * 4.0) / 1e6, 6)
    events = grant.trajectory.to_dict()["events"]
    assert [e["protocol"] for e in events] == PROTOCOLS * 2


@pytest.mark.asyncio
@pytest.mark.parametrize("protocol", ["openai_chat", "anthropic", "gemini"])
async def test_upstream_errors_reach_the_agent_as_sent_and_are_recorded(server: ScriptedServer, protocol: str) -> None:
    server.push(Turn(status=429, error="Rate limit reached, slow down", error_type="rate_limit_error"), garbage())
    async with attempt(server) as grant:
        for expected in (429, 502):
            with pytest.raises(Exception) as raised:
                await call(protocol, grant, stream=False)
            status = getattr(raised.value, "status_code", None) or getattr(raised.value, "code", None)
            assert status == expected
        response = getattr(raised.value, "response", None)
        seen = f"{raised.value} {getattr(raised.value, 'body', '')} {getattr(response, 'text', '')}"
    assert "<html>502 Bad Gateway</html>" in seen  # the garbage, as the upstream sent it
    assert [(c.status, c.error) for c in grant.calls] == [
        (429, "Rate limit reached, slow down"),
        (502, "<html>502 Bad Gateway</html>"),
    ]
    # Both reached the upstream, so both count; an error answer reports no usage and is due none.
    assert grant.usage().calls == 2 and grant.usage().calls_without_usage == 0


@pytest.mark.asyncio
async def test_an_unreachable_upstream_is_a_502_naming_it(server: ScriptedServer) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    async with attempt(server, base_url=closed) as grant:
        with pytest.raises(openai.InternalServerError) as raised:
            await call("openai_chat", grant, stream=False)
    assert raised.value.status_code == 502 and "cannot reach the openai upstream" in str(raised.value)
    (recorded,) = grant.calls
    assert recorded.status is None and "ClientConnectorError" in (recorded.error or "")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


EVENTS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m",'
    + b'"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n' % word
    for word in (b"Hel", b"lo")
]


@pytest.mark.asyncio
async def test_a_stream_the_upstream_cuts_off_is_said_to_be_cut_not_unreachable(server: ScriptedServer) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    with cutting_upstream(head + b"".join(_chunk(e) for e in EVENTS)) as base_url:
        async with attempt(server, base_url=base_url) as grant:
            client = openai.AsyncOpenAI(api_key=grant.token, base_url=grant.base_url("openai_chat"), max_retries=0)
            seen = []
            with pytest.raises(openai.APIError) as raised:  # an error event: not a short answer
                stream = await client.chat.completions.create(model=MODEL, messages=[], stream=True)
                async for event in stream:
                    seen.append(event.choices[0].delta.content)
            await client.close()
    assert seen == ["Hel", "lo"]  # what came before the cut reached the agent, then why it ended
    assert f"model gateway: ClientPayloadError: the response of the openai upstream {base_url} was cut off" in str(
        raised.value
    )
    (recorded,) = grant.calls
    size = sum(len(e) for e in EVENTS)
    assert recorded.status == 200 and (recorded.error or "").startswith(
        f"ClientPayloadError: the response of the openai upstream {base_url} was cut off mid-stream after "
        f"{size} bytes, 2 events: "
    ), recorded.error
    assert "cannot reach" not in (recorded.error or "")


#: The start of a streamed answer in the other APIs: (server-sent events, how many).
STARTS = {
    "anthropic": (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","type":"message",'
        b'"role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":0}}}'
        b'\n\nevent: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}\n\n',
        2,
    ),
    "gemini": (b'data: {"candidates":[{"content":{"parts":[{"text":"Hel"}],"role":"model"},"index":0}]}\r\n\r\n', 1),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("protocol", sorted(STARTS))
async def test_a_cut_stream_ends_with_the_apis_error_event(server: ScriptedServer, protocol: str) -> None:
    events, count = STARTS[protocol]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    with cutting_upstream(head + _chunk(events)) as base_url:
        root = base_url.removesuffix("/v1")
        async with attempt(server, **{f"{protocol}_base_url": root}) as grant:
            with pytest.raises(Exception) as raised:  # the client's own error for the API's error event
                await call(protocol, grant, stream=True)
    expected = f"the response of the {protocol} upstream {root} was cut off mid-stream after {len(events)} bytes, "
    assert f"{count} event" in (grant.calls[0].error or "") and expected in (grant.calls[0].error or "")
    assert f"model gateway: ClientPayloadError: {expected}" in str(raised.value)


@pytest.mark.asyncio
async def test_a_stream_the_upstream_stops_sending_is_said_to_have_stopped(server: ScriptedServer) -> None:
    server.push(stall(text("never finished")))
    async with attempt(server, timeout=0.5) as grant:
        client = openai.AsyncOpenAI(api_key=grant.token, base_url=grant.base_url("openai_chat"), max_retries=0)
        with pytest.raises(openai.APIError) as raised:
            async for _ in await client.chat.completions.create(model=MODEL, messages=[], stream=True):
                pass
        await client.close()
    (recorded,) = grant.calls
    expected = f"the openai upstream {server.base_url} sent no more of its response within 0.5s (after "
    assert expected in (recorded.error or "") and "1 event)" in (recorded.error or ""), recorded.error
    assert expected in str(raised.value)


@pytest.mark.asyncio
async def test_a_body_the_upstream_cuts_off_is_a_502_saying_so(server: ScriptedServer) -> None:
    start = b'{"id": "c1", "object": "chat.completion", '
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    with cutting_upstream(head + start) as base_url:
        async with attempt(server, base_url=base_url) as grant:
            with pytest.raises(openai.InternalServerError) as raised:
                await call("openai_chat", grant, stream=False)
    expected = f"the response of the openai upstream {base_url} was cut off after {len(start)} bytes: "
    assert raised.value.status_code == 502 and expected in str(raised.value)
    (recorded,) = grant.calls
    assert expected in (recorded.error or "") and "cannot reach" not in (recorded.error or "")


@pytest.mark.asyncio
async def test_unknown_expired_and_real_keys_and_other_paths_are_refused(server: ScriptedServer) -> None:
    import aiohttp

    gateway = ModelGateway(MODEL, settings(server), LocalEnvironment(EnvironmentSpec(id="local")))
    try:
        async with gateway.open_attempt(None, "task-1") as grant:  # type: ignore[arg-type]
            url = grant.base_url("openai_chat")
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as session:
                for key in ("agc-" + "0" * 48, KEY, ""):
                    headers = {"Authorization": f"Bearer {key}"}
                    async with session.post(f"{url}/chat/completions", json=body, headers=headers) as answer:
                        assert answer.status == 401
                        assert "unknown or expired" in (await answer.json())["error"]["message"]
                headers = {"Authorization": f"Bearer {grant.token}"}
                async with session.post(f"{url}/files", data=b"x", headers=headers) as answer:
                    assert answer.status == 404 and "does not forward POST /v1/files" in await answer.text()
        with pytest.raises(openai.AuthenticationError, match="unknown or expired"):
            await call("openai_chat", grant, stream=False)  # the attempt is over, the gateway still serves
    finally:
        await gateway.aclose()
    assert server.requests == [] and grant.calls == []


@pytest.mark.asyncio
async def test_the_token_budget_refuses_calls_once_spent(server: ScriptedServer) -> None:
    server.push(*(text("step", prompt_tokens=10, completion_tokens=5) for _ in range(3)))
    async with attempt(server, max_total_tokens=20) as grant:
        await call("anthropic", grant, stream=True)
        await call("anthropic", grant, stream=True)  # 15 of 20 used: still allowed
        with pytest.raises(anthropic.PermissionDeniedError, match="token budget of this attempt is spent"):
            await call("anthropic", grant, stream=True)
    assert len(server.requests) == 2 and grant.usage().total_tokens == 30
    assert grant.stop_reason == "token_budget"
    failed = RunResult("task-1", status=RunStatus.INFERENCE_ERROR, error="agent exited with 1")
    finished = grant.finish(failed)
    assert finished.status is RunStatus.COMPLETED and finished.metadata["stop_reason"] == "token_budget"
    assert finished.metadata["agent_error"] == "agent exited with 1"
    assert finished.metadata["usage"] == {"calls": 2, "prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}


@pytest.mark.asyncio
async def test_max_connections_caps_the_calls_in_flight(server: ScriptedServer) -> None:
    gate = threading.Event()
    server.push(*(Turn(text="ok", gate=gate) for _ in range(5)))
    try:
        async with attempt(server, max_connections=2) as grant:
            calls = [asyncio.ensure_future(call("openai_chat", grant, stream=False)) for _ in range(5)]
            await until(lambda: server.in_flight == 2)
            gate.set()
            assert [said for said, _ in await asyncio.gather(*calls)] == ["ok"] * 5
    finally:
        gate.set()
    assert server.peak_in_flight == 2 and len(grant.calls) == 5


@pytest.mark.asyncio
async def test_an_agent_hanging_up_mid_stream_closes_the_upstream_connection(server: ScriptedServer) -> None:
    server.push(stall(text("never finished")))
    async with attempt(server) as grant:
        client = openai.AsyncOpenAI(api_key=grant.token, base_url=grant.base_url("openai_chat"), max_retries=0)
        events = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        await events.__anext__()  # the first chunk came through: the answer is streaming
        await events.close()
        await until(lambda: server.aborted == 1)
        await until(lambda: len(grant.calls) == 1)
        await client.close()
    assert "hung up" in (grant.calls[0].error or "")


@pytest.mark.asyncio
async def test_ending_the_attempt_stops_its_calls_in_flight_and_the_gateway_closes(server: ScriptedServer) -> None:
    import aiohttp

    # Two parts, two chunks: the first one is not the last (a Gemini answer's last chunk has the finish reason).
    server.push(stall(tool("ls", content="never finished")))
    async with attempt(server) as grant:
        port = int(grant.base_url("gemini").rsplit(":", 1)[1])
        session = aiohttp.ClientSession()
        url = f"{grant.base_url('gemini')}/v1beta/models/m:streamGenerateContent?alt=sse"
        reply = await session.post(url, json={"contents": []}, headers={"x-goog-api-key": grant.token})
        await reply.content.readline()  # streaming
    await until(lambda: server.aborted == 1)  # the grant's end hung up on the upstream
    (recorded,) = grant.calls
    assert recorded.status == 200 and "attempt ended" in (recorded.error or "")
    with pytest.raises(aiohttp.ClientError):
        await reply.content.read()
    reply.close()
    await session.close()
    with pytest.raises(OSError):  # the gateway stopped listening
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


#: A request for one streamed answer in each API (path under the grant's base URL, body, key header),
#: and what the last event of the answer holds.
#: Each protocol's path, body, key header, and a mark only the last event's data line holds: the agent
#: hangs up once it has read that line. (``completed`` alone is also in the message item's
#: ``"status"`` of the event before: an agent hanging up there has not had the whole answer, and the
#: test failed whenever the last event reached the gateway after the client had read that one.)
STREAMED: dict[str, tuple[str, dict[str, Any], str, bytes]] = {
    "openai_chat": ("/chat/completions", {"model": "m", "messages": [], "stream": True}, "authorization", b"[DONE]"),
    "openai_responses": (
        "/responses",
        {"model": "m", "input": "hi", "stream": True},
        "authorization",
        b'"type": "response.completed"',
    ),
    "anthropic": ("/v1/messages", {"model": "m", "messages": [], "stream": True}, "x-api-key", b'"message_stop"'),
    "gemini": ("/v1beta/models/m:streamGenerateContent?alt=sse", {"contents": []}, "x-goog-api-key", b"finishReason"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_stream_the_agent_closes_after_its_last_event_is_a_completed_call(
    server: ScriptedServer, protocol: str
) -> None:
    """The upstream keeps its body open after the last event; the agent has its answer and hangs up. The
    call was recorded 'cancelled' (an error) although the agent got all of it."""
    import aiohttp

    server.push(Turn(text="all of it", prompt_tokens=13, completion_tokens=7, linger=True))
    path, body, header, last = STREAMED[protocol]
    async with attempt(server) as grant:
        key = f"Bearer {grant.token}" if header == "authorization" else grant.token
        async with (
            aiohttp.ClientSession() as session,
            session.post(grant.base_url(protocol) + path, json=body, headers={header: key}) as reply,
        ):
            seen = b""
            while last not in seen:
                line = await reply.content.readline()
                assert line, seen  # the answer ended before its last event
                seen += line
        await until(lambda: server.aborted == 1)  # the hang-up reached the upstream
        await until(lambda: len(grant.calls) == 1)
    (recorded,) = grant.calls
    assert recorded.error is None and recorded.status == 200
    assert recorded.usage is not None and recorded.usage["prompt_tokens"] == 13
    assert recorded.usage["completion_tokens"] == 7
