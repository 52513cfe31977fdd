"""ChatModel with the real ``openai`` client against a loopback server."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_agentcompass.concurrency.limits import reset_limits
from pytest_agentcompass.config import ModelSpec
from pytest_agentcompass.models import ChatModel, ModelCallError, resolve_model
from pytest_agentcompass.models.client import MalformedResponseError, require_openai
from pytest_agentcompass.models.usage import Usage, sum_usage
from pytest_agentcompass.vocabulary.errors import PreflightError

from model_upstream import cutting_upstream
from openai_server import ScriptedServer, answer, error, garbage, scripted_server, slow, tool_call

pytest.importorskip("openai")
KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server() as running:
        yield running
    reset_limits()


def make_model(server: ScriptedServer, **params: Any) -> ChatModel:
    spec = ModelSpec(id="test-model", params={"base_url": server.base_url, "api_key": KEY, **params})
    return ChatModel(resolve_model(spec, "test", environ={}))


async def call_error(model: ChatModel) -> ModelCallError:
    """What one call of ``model`` raises (the model's client is closed after it)."""
    try:
        with pytest.raises(ModelCallError) as caught:
            await model.complete([{"role": "user", "content": "hi"}])
    finally:
        await model.aclose()
    return caught.value


async def until(condition: Any) -> None:
    """Wait for ``condition()`` (no time limit of its own: the test run's timeout is the backstop)."""
    while not condition():
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_answer_usage_and_request_shape(server: ScriptedServer) -> None:
    server.push(answer("4", prompt_tokens=12, completion_tokens=3))
    model = make_model(server, temperature=0, seed=7, headers={"X-Team": "eval"})
    try:
        reply = await model.complete([{"role": "user", "content": "2 + 2"}])
    finally:
        await model.aclose()
    assert reply.content == "4" and reply.tool_calls == []
    assert reply.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert reply.latency > 0
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "test-model"
    assert request["body"]["temperature"] == 0 and request["body"]["seed"] == 7
    assert request["body"]["messages"] == [{"role": "user", "content": "2 + 2"}]
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["x-team"] == "eval"


@pytest.mark.asyncio
async def test_tool_calls_are_parsed(server: ScriptedServer) -> None:
    server.push(tool_call("ls -la", content="let me look"))
    model = make_model(server)
    try:
        reply = await model.complete([{"role": "user", "content": "look"}], tools=[{"type": "function"}])
    finally:
        await model.aclose()
    (call,) = reply.tool_calls
    assert call.name == "shell" and call.arguments == '{"command": "ls -la"}'
    assert reply.message()["tool_calls"][0]["function"]["name"] == "shell"
    assert server.requests[0]["body"]["tools"] == [{"type": "function"}]


@pytest.mark.asyncio
async def test_client_retries_a_429_then_succeeds(server: ScriptedServer) -> None:
    server.push(error(429, "slow down", "rate_limit_exceeded"), error(500), answer("ok"))
    model = make_model(server, max_retries=2)
    try:
        reply = await model.complete([{"role": "user", "content": "hi"}])
    finally:
        await model.aclose()
    assert reply.content == "ok"
    assert len(server.requests) == 3


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "name"), [(429, "RateLimitError"), (500, "InternalServerError"), (503, "InternalServerError")]
)
async def test_errors_after_client_retries_name_class_and_status(
    server: ScriptedServer, status: int, name: str
) -> None:
    server.default = lambda body: error(status, "scripted failure")
    failure = await call_error(make_model(server, max_retries=1))
    message = str(failure)
    assert message.startswith(f"{name} (HTTP {status}) from {server.base_url}")
    assert "after 1 client retry" in message and "scripted failure" in message
    assert failure.retryable and failure.status == status
    assert failure.error_type == name
    assert len(server.requests) == 2


@pytest.mark.asyncio
async def test_authentication_error_is_plain_and_permanent(server: ScriptedServer) -> None:
    server.default = lambda body: error(401, "Incorrect API key provided", "invalid_request_error")
    failure = await call_error(make_model(server, max_retries=3))
    assert str(failure).startswith("AuthenticationError (HTTP 401)")
    assert "rejected the API key" in str(failure)
    assert failure.retryable is False
    assert len(server.requests) == 1  # the client does not retry a 401 either


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "content_type", "problem"),
    [
        ("not json {", "application/json", "is not JSON (Expecting value at character 0); it begins 'not json {'"),
        ("", "application/json", "is not JSON (Expecting value at character 0); it is empty"),
        (b"\xff\xfe{", "application/json", "is not JSON ("),
        ("<html>upstream down</html>", "text/html", "is not a chat completion (it is text, not JSON)"),
        ("[1, 2]", "application/json", "(the answer is a list, not an object); it begins '[1, 2]'"),
        ('{"choices": []}', "application/json", "(choices is empty, not a list of choices)"),
        ('{"choices": [{"message": "hi"}]}', "application/json", "(choices[0].message is a str, not an object)"),
        ('{"choices": [{"message": {"content": 5}}]}', "application/json", "content is an int, not text"),
        ('{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": "x"}}', "application/json", "usage"),
    ],
)
async def test_garbage_from_the_server_is_one_line_naming_the_endpoint(
    server: ScriptedServer, body: str | bytes, content_type: str, problem: str
) -> None:
    server.push(garbage(body, content_type))
    failure = await call_error(make_model(server, max_retries=0))
    assert isinstance(failure, MalformedResponseError)
    message = str(failure)
    assert message.startswith(f"MalformedResponseError: the answer of {server.base_url} for model 'test-model' ")
    assert problem in message and "\n" not in message
    assert failure.error_type == "MalformedResponseError" and failure.retryable
    assert failure.__cause__ is None and failure.__suppress_context__  # no client internals attached


@pytest.mark.asyncio
async def test_slow_answer_is_a_timeout_error(server: ScriptedServer) -> None:
    server.default = lambda body: slow(30)
    failure = await call_error(make_model(server, timeout=0.2, max_retries=0))
    assert str(failure).startswith(f"APITimeoutError: no answer from {server.base_url} within 0.2s")


@pytest.mark.asyncio
async def test_connection_refused_names_the_endpoint() -> None:
    with scripted_server() as gone:
        url = gone.base_url
    spec = ModelSpec(id="m", params={"base_url": url, "api_key": KEY, "max_retries": 0})
    model = ChatModel(resolve_model(spec, "test", environ={}))
    try:
        with pytest.raises(ModelCallError, match=r"^APIConnectionError: cannot reach"):
            await model.complete([{"role": "user", "content": "hi"}])
    finally:
        await model.aclose()


@pytest.mark.asyncio
async def test_an_answer_cut_off_is_said_to_be_cut_not_unreachable() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    with cutting_upstream(head + b'{"id": "c1", "object": "chat.completion", ') as url:
        spec = ModelSpec(id="m", params={"base_url": url, "api_key": KEY, "max_retries": 0})
        model = ChatModel(resolve_model(spec, "test", environ={}))
        try:
            with pytest.raises(ModelCallError) as raised:
                await model.complete([{"role": "user", "content": "hi"}])
        finally:
            await model.aclose()
    assert str(raised.value).startswith(f"APIConnectionError: the answer of {url} was cut off: RemoteProtocolError: ")
    assert "received 42 bytes, expected 500" in str(raised.value) and raised.value.kind == "transport"


@pytest.mark.asyncio
async def test_max_connections_caps_concurrent_requests(server: ScriptedServer) -> None:
    server.default = lambda body: slow(0.2, answer("x"))
    model = make_model(server, max_connections=2)
    try:
        replies = await asyncio.gather(*(model.complete([{"role": "user", "content": str(i)}]) for i in range(6)))
    finally:
        await model.aclose()
    assert [r.content for r in replies] == ["x"] * 6
    assert server.peak_in_flight <= 2
    assert model.permits.peak == 2


@pytest.mark.asyncio
async def test_cancelling_a_call_aborts_it_on_the_wire(server: ScriptedServer) -> None:
    server.default = lambda body: slow(60)
    model = make_model(server)
    call = asyncio.ensure_future(model.complete([{"role": "user", "content": "hi"}]))
    await until(lambda: server.requests)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await model.aclose()
    await until(lambda: server.aborted == 1)
    assert model.client().is_closed() is False  # a new client for this loop after close
    await model.aclose()


def test_one_client_per_event_loop_each_closed_on_its_loop(server: ScriptedServer) -> None:
    model = make_model(server)
    clients = []

    async def one() -> None:
        await model.complete([{"role": "user", "content": "hi"}])
        clients.append(model.client())
        await model.aclose()

    asyncio.run(one())
    asyncio.run(one())
    assert clients[0] is not clients[1]
    assert all(client.is_closed() for client in clients)


# -- settings ---------------------------------------------------------------------
def test_missing_key_is_a_preflight_error() -> None:
    with pytest.raises(PreflightError, match=r"no API key for the model: set model\.params\.api_key"):
        resolve_model(ModelSpec(id="m"), "harness", environ={})


def test_key_and_base_url_fall_back_to_the_environment() -> None:
    environ = {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://x/v1"}
    resolved = resolve_model(ModelSpec(id="m"), "h", environ=environ)
    assert resolved.api_key == KEY and resolved.base_url == "http://x/v1"
    assert KEY not in repr(resolved)


def test_unknown_or_wrong_model_params_are_named() -> None:
    spec = ModelSpec(id="m", params={"api_key": "k", "temprature": 0, "timeout": "soon"})
    with pytest.raises(PreflightError) as caught:
        resolve_model(spec, "h", environ={})
    assert "model.params.temprature: unknown key" in str(caught.value)
    assert "model.params.timeout: Input should be a valid number" in str(caught.value)


def test_no_model_configured() -> None:
    with pytest.raises(PreflightError, match="harness 'x' needs a model"):
        resolve_model(None, "harness 'x'")


def test_missing_openai_package_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # what an absent package looks like to import
    with pytest.raises(PreflightError, match=r"pip install 'pytest-agentcompass\[openai\]'"):
        require_openai()


def test_usage_sums_and_cost() -> None:
    usage = Usage()
    usage.add_call(1000, 200)
    usage.add_call(500, 100, 600)
    usage.price(2.0, 8.0)
    assert usage.to_dict() == {
        "calls": 2,
        "prompt_tokens": 1500,
        "completion_tokens": 300,
        "total_tokens": 1800,
        "cost": 0.0054,
    }
    totals = sum_usage([usage.to_dict(), None, {"calls": 1, "prompt_tokens": 1, "completion_tokens": 1}])
    assert totals == {
        "calls": 3,
        "prompt_tokens": 1501,
        "completion_tokens": 301,
        "total_tokens": 1800,
        "tasks": 2,
        "cost": 0.0054,
    }
    assert sum_usage([None, None]) is None


def test_client_loggers_mask_the_key(caplog: pytest.LogCaptureFixture) -> None:
    from pytest_agentcompass.models.client import guard_secrets

    guard_secrets(KEY)
    with caplog.at_level("DEBUG"):
        logging.getLogger("openai._base_client").debug("Request options: %s", {"json_data": {"content": KEY}})
        logging.getLogger("httpx").info("sent %s", KEY)
    assert KEY not in caplog.text
    assert "Request options: {'json_data': {'content': '***'}}" in caplog.text


def test_short_placeholder_keys_are_not_masked() -> None:
    from pytest_agentcompass.vocabulary.redact import Redactor, add_runtime_secret

    add_runtime_secret("none")
    assert Redactor().text("none of this is secret") == "none of this is secret"
