"""Whole runs with model-calling harnesses: secrets, preflight, Ctrl-C, xdist, Docker, the quickstart."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import DEADLINES, KEY, agent_request, detail, run_dir, write_agent_config
from conftest import DOCKER_TEST_IMAGE, docker_has, start_pytest, write_config
from openai_server import Reply, ScriptedServer, answer, error, scripted_server, slow, tool_call

pytest.importorskip("openai")
ROOT = Path(__file__).parent.parent.parent
RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server() as running:
        yield running


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


@pytest.mark.parametrize("source", ["config", "environment"])
def test_the_api_key_reaches_no_file_log_or_terminal(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    # The agent prints the key, and the server echoes it in an error: both must be masked.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.push(tool_call("echo key=$OPENAI_API_KEY"), error(401, f"Incorrect API key provided: {KEY}"))
    params = {"api_key": "${OPENAI_API_KEY}"} if source == "config" else {}
    request = agent_request(server)
    request["model"]["params"] = {"base_url": server.base_url, "max_retries": 0, **params}
    write_config(pytester, [request])
    result = pytester.runpytest(*RUN, "--log-level=DEBUG", "--junitxml=junit.xml", "-rA", "-v")
    result.assert_outcomes(errors=1)
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEY}"  # it was used
    text = result.stdout.str() + result.stderr.str()
    assert KEY not in text
    assert "Incorrect API key provided: ***" in text
    assert files_containing(pytester.path, KEY) == []
    events = json.loads((run_dir(pytester) / detail(pytester)["artifacts"]["trajectory"]).read_text())["events"]
    assert events[3]["message"]["content"] == "exit code: 0\nstdout:\nkey=\n"  # commands never see the key


def test_missing_key_is_one_preflight_error(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    request = agent_request(server, n=3)
    request["model"]["params"].pop("api_key")
    write_config(pytester, [request])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=3)
    # Said once, in the summary; each task's report points there.
    assert len(re.findall(r"no API key for the model", result.stdout.str())) == 1
    assert len(re.findall(r"request 'agent' failed its preflight", result.stdout.str())) == 3
    result.stdout.fnmatch_lines(["*request 'agent': no API key for the model: set model.params.api_key*"])
    assert server.requests == []


def test_missing_key_under_xdist_is_not_retried(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The controller preflights once and prints why; the workers fail their tasks without a call.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    request = agent_request(server, n=2, execution={"max_retries": 2})
    request["model"]["params"].pop("api_key")
    write_config(pytester, [request])
    result = pytester.runpytest_subprocess(*RUN, "-n", "2")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*failed its preflight (the reason is in the agentcompass summary)*"])
    assert result.stdout.str().count("no API key for the model") == 1  # once, in the summary
    assert server.requests == []
    info = json.loads((run_dir(pytester, "agent") / "run_info.json").read_text())
    assert info["status"] == "failed" and "no API key" in info["stop_reason"]


def test_missing_openai_package_is_one_preflight_error(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # how an absent package looks to import
    write_agent_config(pytester, server, n=2)
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*request 'agent': the openai package is not installed*[[]openai]'*"])
    assert server.requests == []


def test_bad_harness_params_are_a_clear_config_error(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    write_agent_config(pytester, server, params={"max_turns": "many", "tools": []})
    result = pytester.runpytest(*RUN)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            "*agentcompass.yaml:*: requests[[]0].harness.params.max_turns: Input should be a valid integer*",
            "*agentcompass.yaml:*: requests[[]0].harness.params.tools: unknown key",
        ]
    )
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()


def test_ctrl_c_aborts_the_call_in_flight_and_closes_the_client(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.default = lambda body: slow(300)
    write_agent_config(pytester, server, n=2, cleanup_grace_seconds=20)
    proc = start_pytest(pytester)
    server.wait_until(lambda: len(server.requests) == 2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "cancelled: interrupted by the user" in out
    server.wait_until(lambda: server.aborted == 2)
    assert "Unclosed" not in out and "Task was destroyed" not in out
    info = json.loads((run_dir(pytester) / "run_info.json").read_text())
    assert info["status"] == "interrupted"
    # The agents' trajectories up to the interrupt are kept.
    for task_id in ("file-0", "file-1"):
        saved = json.loads((run_dir(pytester) / f"artifacts/{task_id}/attempt-0/trajectory.json").read_text())
        assert saved["stop_reason"] == "interrupted"


def test_deadline_aborts_calls_in_flight(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.default = lambda body: slow(300)
    # The deadline starts once the run's preflight is done: openai, the slowest part of a task's
    # first call, is imported before that (by collection), so the calls are in flight well within it.
    pytester.makeconftest("import openai")
    for deadline in DEADLINES:
        write_agent_config(pytester, server, n=2, timeout_seconds=deadline)
        result = pytester.runpytest_subprocess(*RUN, "--agentcompass-new-run")
        result.assert_outcomes(errors=2)
        result.stdout.fnmatch_lines([f"*orchestration timeout of {deadline}s reached*"])
        if server.requests:
            break
    assert server.requests
    # Every call in flight at the deadline was abandoned on the wire, none answered.
    server.wait_until(lambda: server.aborted == len(server.requests))


def test_xdist_workers_each_close_their_clients(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.default = lambda body: (
        answer("done") if any(m["role"] == "tool" for m in body["messages"]) else tool_call("printf hi > hello.txt")
    )
    write_agent_config(pytester, server, n=4)
    result = pytester.runpytest_subprocess(*RUN, "-n", "2", "-W", "error::ResourceWarning")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*usage: 8 model calls, 120 prompt + 52 completion = 172 tokens*"])
    text = result.stdout.str() + result.stderr.str()
    assert "Unclosed" not in text and "Event loop is closed" not in text


def arithmetic(body: dict[str, Any]) -> Reply:
    a, op, b = body["messages"][-1]["content"].split()
    value = {"+": int(a) + int(b), "*": int(a) * int(b), "/": int(a) / int(b)}[op]
    return answer(str(value))


def test_openai_harness_server_error_is_an_inference_error(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    shutil.copytree(ROOT / "example_suites" / "quickstart", pytester.path / "quickstart")
    server.default = lambda body: error(503, "overloaded")
    write_config(
        pytester,
        [
            {
                "name": "arithmetic",
                "benchmark": {"id": "quickstart/arith.py:ArithmeticBenchmark", "params": {"n": 1}},
                "harness": {"id": "openai"},
                "model": {"id": "calc", "params": {"base_url": server.base_url, "api_key": KEY, "max_retries": 1}},
            }
        ],
    )
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*InternalServerError (HTTP 503) from*after 1 client retry: overloaded*"])
    assert len(server.requests) == 2


def test_quickstart_with_the_openai_harness(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    shutil.copytree(ROOT / "example_suites" / "quickstart", pytester.path / "quickstart")
    server.default = arithmetic
    write_config(
        pytester,
        [
            {
                "name": "arithmetic",
                "benchmark": {"id": "quickstart/arith.py:ArithmeticBenchmark", "params": {"n": 12}},
                "harness": {"id": "openai", "params": {"system_prompt": "Answer with the number only."}},
                "model": {"id": "calc", "params": {"base_url": server.base_url, "api_key": KEY, "temperature": 0}},
            }
        ],
    )
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["*usage: 12 model calls, 120 prompt + 60 completion = 180 tokens*"])
    summary = json.loads((run_dir(pytester, "arithmetic") / "summary.json").read_text())
    assert summary["usage"] == {
        "calls": 12,
        "prompt_tokens": 120,
        "completion_tokens": 60,
        "total_tokens": 180,
        "tasks": 12,
    }
    first = server.bodies()[0]
    assert first["messages"][0] == {"role": "system", "content": "Answer with the number only."}
    assert first["temperature"] == 0 and "tools" not in first


# -- Docker ---------------------------------------------------------------------------
IMAGE = DOCKER_TEST_IMAGE


@pytest.mark.parametrize(
    "provider",
    [
        "local",
        pytest.param(
            "docker", marks=pytest.mark.skipif(not docker_has(IMAGE), reason="no Docker engine with the test image")
        ),
    ],
)
def test_agent_commands_get_a_clean_environment(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, provider: str
) -> None:
    # pytest's own environment holds the model's key and a CI job's token; the agent sees neither.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("CI_DEPLOY_TOKEN", "ci-token-5e1d0c9b77")
    monkeypatch.setenv("AGENT_SETTING", "passed-on-purpose")
    server.push(
        tool_call("env"),
        tool_call("cat /proc/self/environ"),
        tool_call("printf hi > hello.txt"),
        answer("done"),
    )
    if provider == "local":  # the host is the base: what the agent may see is named
        environment: dict[str, Any] = {"id": "local", "params": {"pass_env": ["AGENT_SETT*"]}}
    else:  # the container's own environment is the base: nothing of the host's
        environment = {"id": "docker", "params": {"image": IMAGE}}
    request = agent_request(server, environment=environment)
    request["model"]["params"].pop("api_key")  # read from $OPENAI_API_KEY by the harness
    write_config(pytester, [request])
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    assert {k.lower(): v for k, v in server.requests[0]["headers"].items()}["authorization"] == f"Bearer {KEY}"
    env_output, environ = [m["content"] for m in server.bodies()[-1]["messages"] if m["role"] == "tool"][:2]
    for seen in (env_output, environ):  # what went back to the model: what the agent saw
        assert "PATH=" in seen and "HOME=" in seen
        assert KEY not in seen and "***" not in seen and "ci-token-5e1d0c9b77" not in seen
        assert "OPENAI" not in seen and "PYTEST" not in seen
        assert ("AGENT_SETTING=passed-on-purpose" in seen) is (provider == "local")
    trajectory = (run_dir(pytester) / detail(pytester)["artifacts"]["trajectory"]).read_text()
    assert "ci-token" not in trajectory and "OPENAI_API_KEY" not in trajectory


@pytest.mark.parametrize("run_network", ["full", "disabled"])
def test_shell_agent_in_docker(
    docker_engine: str, pytester: pytest.Pytester, server: ScriptedServer, run_network: str
) -> None:
    # The model is called from the pytest process: a container without network still has an agent.
    server.push(
        tool_call("pwd && ls && ls /sys/class/net", content="looking around"),
        tool_call("printf hi > hello.txt"),
        answer("done"),
    )
    environment = {"id": "docker", "params": {"image": docker_engine}, "network": {"run": run_network}}
    write_agent_config(pytester, server, environment=environment)
    pytester.runpytest(*RUN).assert_outcomes(passed=1)
    tools = [m["content"] for m in server.bodies()[-1]["messages"] if m["role"] == "tool"]
    assert tools[0].startswith("exit code: 0\nstdout:\n/") and "README" in tools[0]
    interfaces = set(tools[0].split("\n")[3:])
    assert ("eth0" in interfaces) is (run_network == "full")
    run_id = run_dir(pytester).name
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=agentcompass.run={run_id}"], capture_output=True, text=True
    ).stdout.split()
    assert left == []
