"""The shell agent end to end: real client, loopback server, local provider, pytest reports."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import pytest

from pytest_agentcompass.harnesses.shell_agent import SHELL_TOOL
from pytest_agentcompass.models.client import ChatModel

from agent_helpers import DEADLINES, detail, run_dir, trajectory, write_agent_config
from openai_server import ScriptedServer, answer, error, garbage, scripted_server, slow, tool_call

pytest.importorskip("openai")
RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server() as running:
        yield running


def test_agent_solves_a_task_with_a_tool_call(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.push(tool_call("printf hi > hello.txt", content="writing it"), answer("done: wrote hello.txt"))
    write_agent_config(pytester, server, model_params={"input_price_per_million": 1.0, "output_price_per_million": 4.0})
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*usage: 2 model calls, 30 prompt + 13 completion = 43 tokens, estimated cost*"])

    record = detail(pytester)
    assert record["output"] == "done: wrote hello.txt"
    assert record["metadata"]["usage"] == {
        "calls": 2,
        "prompt_tokens": 30,
        "completion_tokens": 13,
        "total_tokens": 43,
        "cost": round((30 * 1.0 + 13 * 4.0) / 1e6, 6),
    }
    assert record["metadata"]["stop_reason"] == "answered"
    summary = json.loads((run_dir(pytester) / "summary.json").read_text())
    assert summary["usage"]["total_tokens"] == 43 and summary["usage"]["calls"] == 2

    first, second = server.bodies()
    assert first["tools"] == [SHELL_TOOL]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == "Write 'hi' into hello.txt."
    call_id = second["messages"][2]["tool_calls"][0]["id"]
    assert second["messages"][3] == {"role": "tool", "tool_call_id": call_id, "content": "exit code: 0"}

    saved = trajectory(pytester, record)
    assert saved["format"] == "agentcompass.trajectory/1"
    assert saved["model"] == "test-model" and saved["stop_reason"] == "answered" and saved["turns"] == 2
    assert [e["type"] for e in saved["events"]] == ["message", "message", "model_call", "tool_result", "model_call"]
    tool = saved["events"][3]
    assert tool["command"] == "printf hi > hello.txt" and tool["exit_code"] == 0 and tool["truncated"] is False
    assert saved["events"][2]["usage"] == {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28}
    assert saved["events"][2]["latency_seconds"] > 0


def test_malformed_tool_calls_are_fed_back(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.push(
        tool_call(arguments='{"command": "printf hi >'),
        tool_call(arguments='{"cmd": "ls"}'),
        tool_call(name="python", arguments='{"code": "1"}'),
        tool_call("printf hi > hello.txt"),
        answer("done"),
    )
    write_agent_config(pytester, server)
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    last = server.bodies()[-1]["messages"]
    errors = [m["content"] for m in last if m["role"] == "tool"][:3]
    assert errors[0].startswith("error: the arguments are not valid JSON")
    assert errors[1] == 'error: the arguments must be an object with a non-empty string "command"'
    assert errors[2].startswith("error: unknown tool 'python'")


def test_max_turns_ends_the_loop_and_the_report_shows_the_last_turns(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.default = lambda body: tool_call("echo still looking")
    write_agent_config(pytester, server, params={"max_turns": 3})
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)
    assert len(server.requests) == 3
    assert detail(pytester)["metadata"]["stop_reason"] == "max_turns"
    result.stdout.fnmatch_lines(
        [
            "*Captured agent turns call*",
            "[[]turn 3] assistant:*",  # [[] is a literal "[" to fnmatch
            '    -> shell({"command": "echo still looking"})',
            "[[]tool] exit code: 0\\nstdout:\\nstill looking\\n",
            "stopped: max_turns",
        ]
    )


def test_token_budget_ends_the_loop(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.default = lambda body: tool_call("true")  # 28 tokens per call
    write_agent_config(pytester, server, params={"max_total_tokens": 50})
    pytester.runpytest(*RUN).assert_outcomes(failed=1)
    assert len(server.requests) == 2
    record = detail(pytester)
    assert record["metadata"]["stop_reason"] == "token_budget"
    assert record["metadata"]["usage"]["total_tokens"] == 56


def test_long_output_is_cut_in_the_middle_and_slow_commands_are_killed(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.push(
        tool_call("echo FIRST; yes abcdefghij | head -c 50000; echo; echo LAST"),
        tool_call("sleep 30"),
        tool_call("printf hi > hello.txt"),
        answer("done"),
    )
    write_agent_config(pytester, server, params={"output_limit": 1000, "command_timeout": 0.5})
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    tools = [m["content"] for m in server.bodies()[-1]["messages"] if m["role"] == "tool"]
    assert len(tools[0]) < 1100 and "characters omitted ...]" in tools[0]
    assert "FIRST" in tools[0] and tools[0].rstrip().endswith("LAST")
    assert "killed: the command exceeded its 0.5s timeout" in tools[1]
    events = trajectory(pytester, detail(pytester))["events"]
    results = [e for e in events if e["type"] == "tool_result"]
    assert results[0]["truncated"] is True and results[1]["timed_out"] is True


def test_the_omitted_count_is_exact_also_past_the_environment_limit(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    # 300,001 bytes of "é\n" (2 bytes + 1; the last one half a character): the Environment keeps
    # 100,000 bytes and cuts a character in two; the agent keeps 1,000 characters of the rest.
    server.push(tool_call("echo START; yes é | head -c 300001; echo ERR >&2"), tool_call("printf hi > hello.txt"))
    server.push(answer("done"))
    environment = {"id": "local", "params": {"output_limit": 100_000}}
    write_agent_config(pytester, server, params={"output_limit": 1000}, environment=environment)
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    shown = next(m["content"] for m in server.bodies()[-1]["messages"] if m["role"] == "tool")
    stdout = "START\n" + "é\n" * 100_000 + "\N{REPLACEMENT CHARACTER}"  # the command's output, decoded
    full = f"exit code: 0\nstdout:\n{stdout}\nstderr:\nERR\n"
    parts = re.split(r"\n\[\.\.\. (\d+) characters omitted \.\.\.\]\n", shown)
    assert len(parts) == 5  # the agent's cut in the middle, the Environment's at the end of stdout
    position = 0  # every shown piece sits where it is in the full output, every count is its gap
    for index, part in enumerate(parts):
        if index % 2:
            position += int(part)
        else:
            assert full[position : position + len(part)] == part
            position += len(part)
    assert position == len(full)
    assert shown.startswith("exit code: 0\nstdout:\nSTART\n") and shown.endswith("stderr:\nERR\n")


def test_run_timeout_stops_the_agent_and_the_task_is_still_evaluated(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.default = lambda body: slow(120)
    for run_timeout in DEADLINES:  # long enough for the first turn to end in time, however loaded the machine
        calls, aborted = len(server.requests), server.aborted
        server.script.clear()
        server.push(tool_call("printf hi > hello.txt"))
        write_agent_config(pytester, server, execution={"timeouts": {"run": run_timeout}})
        result = pytester.runpytest(*RUN, "--agentcompass-new-run")
        if len(server.requests) - calls == 2:  # the second call was in flight when the time ran out
            break
    result.assert_outcomes(passed=1)  # the file was written before the time ran out
    record = json.loads(max((pytester.path / "runs/agent").glob("*/details/file-0.json")).read_text())
    assert record["metadata"]["stop_reason"] == "timeout"
    server.wait_until(lambda: server.aborted == aborted + 1)  # the call in flight was abandoned on the wire


def test_rate_limit_is_an_inference_error_a_pattern_can_retry(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.default = lambda body: error(429, "Rate limit reached", "rate_limit_exceeded")
    write_agent_config(pytester, server, execution={"max_retries": 1, "retry_pattern_list": ["429"]})
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*inference_error*RateLimitError (HTTP 429) from*Rate limit reached*", "*after 1 retry*"]
    )
    assert len(server.requests) == 2
    record = detail(pytester)
    assert record["retries"] == 1 and record["metadata"]["usage"]["calls"] == 0


def test_garbage_from_the_server_is_one_line_naming_it_and_a_pattern_can_retry_it(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.push(
        tool_call("printf hi > hello.txt"), garbage('{"id": "chatcmpl-1", "choi'), garbage("<html>", "text/html")
    )
    write_agent_config(pytester, server, execution={"max_retries": 1, "retry_pattern_list": ["MalformedResponseError"]})
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    endpoint = server.base_url
    result.stdout.fnmatch_lines(
        [
            "inference_error in the inference_result stage: MalformedResponseError: the answer of "
            f"{endpoint} for model 'test-model' is not a chat completion (it is text, not JSON); it begins '<html>'",
            "after 1 retry",
            "detail: *",
        ]
    )
    assert "Traceback" not in result.stdout.str() and "openai/" not in result.stdout.str()
    record = detail(pytester)
    assert record["metadata"]["error_type"] == "MalformedResponseError"
    assert record["metadata"]["error_kind"] != "programming" and record["trace"] is None
    retried = json.loads(next((run_dir(pytester) / "retry_details/file-0").iterdir()).read_text())
    assert retried["error"].startswith(
        f"MalformedResponseError: the answer of {endpoint} for model 'test-model' is not JSON"
    )
    # The trajectory of each try is kept, up to the call that failed.
    failed = trajectory(pytester, record)
    assert failed["stop_reason"] == "error" and failed["events"][-1]["error"] == record["error"]


def test_garbage_from_the_server_is_a_transport_fault_the_transient_policy_retries(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.push(garbage("<html>", "text/html"))
    server.default = lambda body: answer("done")
    write_agent_config(pytester, server, execution={"max_retries": 1, "retry_pattern_list": "transient"})
    result = pytester.runpytest(*RUN)
    record = detail(pytester)
    assert record["retries"] == 1, result.stdout.str()
    retried = json.loads(next((run_dir(pytester) / "retry_details/file-0").iterdir()).read_text())
    assert retried["error_kind"] == "transport" and retried["matched_pattern"] == "kind:transport"


def test_authentication_error_is_not_retried_by_default(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.default = lambda body: error(401, "Incorrect API key provided", "invalid_request_error")
    write_agent_config(pytester, server, execution={"max_retries": 2})
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*AuthenticationError (HTTP 401)*rejected the API key*"])
    assert len(server.requests) == 1 and detail(pytester)["retries"] == 0


def test_authentication_error_retries_when_a_pattern_names_it(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.default = lambda body: error(401, "Incorrect API key provided", "invalid_request_error")
    write_agent_config(pytester, server, execution={"max_retries": 2, "retry_pattern_list": ["AuthenticationError"]})
    pytester.runpytest(*RUN).assert_outcomes(errors=1)
    assert len(server.requests) == 3 and detail(pytester)["retries"] == 2


def test_trajectory_of_a_failed_try_is_kept_beside_the_retry(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.push(tool_call("echo try one"), error(500, "boom"), tool_call("printf hi > hello.txt"), answer("ok"))
    write_agent_config(pytester, server, execution={"max_retries": 1})
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    folder = run_dir(pytester) / "artifacts" / "file-0"
    assert sorted(p.name for p in folder.iterdir()) == ["attempt-0", "attempt-0-retry-1"]
    failed = json.loads((folder / "attempt-0" / "trajectory.json").read_text())
    assert failed["stop_reason"] == "error" and failed["events"][-1]["type"] == "error"
    record = detail(pytester)
    assert record["artifacts"]["trajectory"] == "artifacts/file-0/attempt-0-retry-1/trajectory.json"
    # The task's usage counts the replaced try too: 1 call there, 2 in the try that stood.
    assert record["metadata"]["usage"] == {"calls": 3, "prompt_tokens": 50, "completion_tokens": 21, "total_tokens": 71}


def test_usage_counts_every_semantic_attempt(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.push(tool_call("printf hi > hello.txt"), answer("done"), answer("nothing to do"))
    write_agent_config(pytester, server, execution={"attempts": {"k": 2, "strategy": "avg"}})
    pytester.runpytest(*RUN).assert_outcomes(failed=1)  # one of two attempts wrote the file: mean 0.5
    record = detail(pytester)
    assert record["score"] == 0.5
    assert record["metadata"]["usage"] == {"calls": 3, "prompt_tokens": 40, "completion_tokens": 18, "total_tokens": 58}
    summary = json.loads((run_dir(pytester) / "summary.json").read_text())
    assert summary["usage"]["calls"] == 3


@pytest.mark.parametrize("ending", ["completed", "deadline"])
def test_the_request_client_is_closed_at_the_end(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    closed: list[bool] = []
    real_aclose = ChatModel.aclose

    async def recording_aclose(self: ChatModel) -> None:
        client = self._clients.get(asyncio.get_running_loop())
        await real_aclose(self)
        closed.append(client is not None and client.is_closed())

    monkeypatch.setattr(ChatModel, "aclose", recording_aclose)
    if ending == "completed":
        server.default = lambda body: (
            answer("done") if any(m["role"] == "tool" for m in body["messages"]) else tool_call("printf hi > hello.txt")
        )
        write_agent_config(pytester, server, n=3)
        pytester.runpytest(*RUN).assert_outcomes(passed=3)
    else:
        server.default = lambda body: slow(300)
        for deadline in DEADLINES:
            closed.clear()
            write_agent_config(pytester, server, n=2, timeout_seconds=deadline)
            pytester.runpytest(*RUN, "--agentcompass-new-run").assert_outcomes(errors=2)
            if server.requests:
                break
        server.wait_until(lambda: server.aborted == len(server.requests) > 0)
    assert closed == [True]  # one client for the request, shared by its tasks, closed once


def test_both_streams_keep_their_header_when_cut(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    # The cut in the middle of the whole text took the "stderr:" header with it.
    server.push(
        tool_call("yes out | head -c 5000; yes err | head -c 5000 >&2"),
        tool_call("printf hi > hello.txt"),
        answer("done"),
    )
    write_agent_config(pytester, server, params={"output_limit": 1000})
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    shown = next(m["content"] for m in server.bodies()[-1]["messages"] if m["role"] == "tool")
    assert shown.startswith("exit code: 0\nstdout:\nout\n") and "\nstderr:\nerr\n" in shown, shown
    assert shown.count("characters omitted ...]") == 2 and len(shown) < 1100
