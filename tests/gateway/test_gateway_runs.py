"""Runs of the ``command`` harness whose agent reaches the scripted upstream through the model gateway.

The "agent" is a small client (Python's urllib on the host, busybox ``wget``
in a container); the upstream accepts only the real key, which the agent
never gets. Usage per task is compared with what the upstream reported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import SUITES, docker_has, start_pytest, write_config
from containers import changed_files, docker
from model_upstream import ScriptedServer, scripted_server, stall, text

pytest.importorskip("aiohttp")

KEY = "sk-real-upstream-key-9c2e5b7a41"
RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
FILE_TASKS = f"{SUITES / 'file_tasks.py'}:FileTasks"
#: Built offline by scripts/build-base-images.sh; it has sh and curl.
IMAGE = "python:3.12-slim"
NO_DOCKER = f"no Docker engine with {IMAGE} (run scripts/start-docker.sh and scripts/build-base-images.sh)"

#: Two chat completions (the second streamed) through the gateway, then the task's file.
PY_AGENT = """\
import json, os, sys, urllib.request, urllib.error
def ask(stream):
    prompt = os.environ["AGENTCOMPASS_PROMPT"]
    body = {"model": "whatever", "stream": stream, "messages": [{"role": "user", "content": prompt}]}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
        {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as exc:
        print("refused:", exc.code, exc.read().decode(), file=sys.stderr)
        return None
calls = int(os.environ.get("CALLS", "2"))
for number in range(calls):
    if ask(stream=number % 2 == 1) is None:
        sys.exit(3)
open("hello.txt", "w").write("hi")
print("done")
"""


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server(api_key=KEY) as running:
        yield running


def gateway_request(server: ScriptedServer, params: dict[str, Any], **extra: Any) -> dict[str, Any]:
    model_params = {"base_url": server.base_url, "api_key": "${UPSTREAM_KEY}", **extra.pop("model_params", {})}
    return {
        "name": "agent",
        "benchmark": {"id": FILE_TASKS, "params": {"n": extra.pop("n", 1)}},
        "harness": {"id": "command", "params": {"timeout": 120, **params}},
        "environment": extra.pop("environment", {"id": "local"}),
        "model": {"id": "the-model", "params": model_params},
        "execution": {"retry_backoff_seconds": 0, **extra.pop("execution", {})},
    }


@pytest.fixture(autouse=True)
def key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", KEY)


def run_dir(pytester: pytest.Pytester) -> Path:
    (found,) = (pytester.path / "runs" / "agent").iterdir()
    return found


def detail(pytester: pytest.Pytester, task_id: str = "file-0") -> dict[str, Any]:
    return json.loads((run_dir(pytester) / "details" / f"{task_id}.json").read_text())  # type: ignore[no-any-return]


def written_anywhere(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def py_agent(pytester: pytest.Pytester) -> list[str]:
    script = pytester.path / "agent.py"
    script.write_text(PY_AGENT)
    return [sys.executable, str(script)]


def test_usage_per_task_is_what_the_upstream_counted_and_the_key_stays_out(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    server.push(
        text("thinking", prompt_tokens=31, completion_tokens=7), text("done", prompt_tokens=40, completion_tokens=9)
    )
    write_config(pytester, [gateway_request(server, {"command": py_agent(pytester)})])
    result = pytester.runpytest(*RUN, "--junitxml=junit.xml")
    result.assert_outcomes(passed=1)
    record = detail(pytester)
    reported = server.reported()
    assert reported == {"calls": 2, "prompt_tokens": 71, "completion_tokens": 16, "total_tokens": 87}
    assert record["metadata"]["usage"] == reported
    result.stdout.fnmatch_lines(["*usage: 2 model calls, 71 prompt + 16 completion = 87 tokens*"])
    trajectory = json.loads((run_dir(pytester) / record["artifacts"]["trajectory"]).read_text())
    calls = [e for e in trajectory["events"] if e["type"] == "model_call"]
    assert [(c["protocol"], c["stream"], c["status"]) for c in calls] == [
        ("openai_chat", False, 200),
        ("openai_chat", True, 200),
    ]
    assert [c["message"]["content"] for c in calls] == ["thinking", "done"]
    assert calls[0]["request"]["messages"][0]["content"] == "Write 'hi' into hello.txt."
    assert {b["model"] for b in server.bodies()} == {"the-model"}
    assert KEY.encode() not in written_anywhere(pytester.path) and KEY not in result.stdout.str()


def test_a_spent_token_budget_stops_the_agent_and_its_work_is_still_evaluated(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.push(*(text("step", prompt_tokens=10, completion_tokens=5) for _ in range(3)))
    # The third call is over budget: the agent exits 3 without writing its file. (Agent commands
    # see none of pytest's environment: the count goes through the harness's own env.)
    params = {"command": py_agent(pytester), "env": {"CALLS": "3"}}
    request = gateway_request(server, params, model_params={"max_total_tokens": 20})
    write_config(pytester, [request])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(failed=1)  # evaluated (no file: score 0), not an inference error to retry
    record = detail(pytester)
    assert record["status"] == "scored" and record["retries"] == 0
    assert record["metadata"]["stop_reason"] == "token_budget"
    assert "agent command exited with 3" in record["metadata"]["agent_error"]
    assert "refused: 403" in record["metadata"]["agent"]["stderr_tail"]
    assert record["metadata"]["usage"]["total_tokens"] == 30 and len(server.requests) == 2


def test_model_params_are_checked_at_load_and_a_missing_key_at_preflight(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(pytester, [gateway_request(server, {"command": "true"}, model_params={"temperature": 0})])
    result = pytester.runpytest(*RUN)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*agentcompass.yaml:*: requests[[]0].model.params.temperature: unknown key"])
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    request = gateway_request(server, {"command": "true"})
    del request["model"]["params"]["api_key"]
    message = "*no API key for the model gateway's upstream (openai: model.params.api_key or $OPENAI_API_KEY*"
    fails_preflight(pytester, request, message)


def fails_preflight(pytester: pytest.Pytester, request: dict[str, Any], message: str) -> None:
    """Every task of ``request`` is a setup error pointing at one preflight message, with no traceback."""
    write_config(pytester, [request])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=request["benchmark"]["params"]["n"])
    result.stdout.fnmatch_lines([message])
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()


def test_xdist_workers_each_run_a_gateway_and_usage_adds_up(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.responder = lambda seen: text("ok", prompt_tokens=20, completion_tokens=3)
    write_config(pytester, [gateway_request(server, {"command": py_agent(pytester)}, n=4)])
    result = pytester.runpytest_subprocess(*RUN, "-n", "2", "-W", "error::ResourceWarning")
    result.assert_outcomes(passed=4)
    assert server.reported() == {"calls": 8, "prompt_tokens": 160, "completion_tokens": 24, "total_tokens": 184}
    result.stdout.fnmatch_lines(["*usage: 8 model calls, 160 prompt + 24 completion = 184 tokens*"])
    assert "Unclosed" not in result.stdout.str() + result.stderr.str()


def test_ctrl_c_mid_stream_closes_the_upstream_connection(pytester: pytest.Pytester, server: ScriptedServer) -> None:
    server.push(text("first"), stall(text("never finished")))
    write_config(pytester, [gateway_request(server, {"command": py_agent(pytester)})], cleanup_grace_seconds=30)
    process = start_pytest(pytester, own_group=True)
    try:
        server.wait_until(lambda: server.in_flight == 1 and len(server.requests) == 2)  # the stream has begun
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    server.wait_until(lambda: server.aborted == 1)  # the gateway hung up on the upstream
    info = json.loads((run_dir(pytester) / "run_info.json").read_text())
    assert info["status"] == "interrupted", output
    trajectory = next((run_dir(pytester) / "artifacts").rglob("trajectory.json"))
    calls = [e for e in json.loads(trajectory.read_text())["events"] if e["type"] == "model_call"]
    assert calls[0]["status"] == 200 and ("hung up" in calls[1]["error"] or "ended" in calls[1]["error"])


# -- Docker: run: disabled leaves the gateway and nothing else ------------------------------------
#: The environment into a file, one call through the gateway, one to a server of the host.
SH_AGENT = textwrap.dedent(
    """\
    env > env.txt
    body='{"model":"x","messages":[{"role":"user","content":"hi"}]}'
    if curl -sSf -m 60 -o answer.json -H "Authorization: Bearer $OPENAI_API_KEY" \\
        -H 'Content-Type: application/json' -d "$body" "$OPENAI_BASE_URL/chat/completions"
    then echo gateway=reached; else echo gateway=unreachable; fi
    if curl -sf -m 10 -o /dev/null "$DECOY_URL"; then echo decoy=reached; else echo decoy=unreachable; fi
    printf hi > hello.txt
    """
)


@pytest.fixture
def decoy() -> Iterator[ScriptedServer]:
    """A server of this host on a bridge network the test makes: no agent may reach it."""
    name = f"agentcompass-test-decoy-{uuid.uuid4().hex[:8]}"
    docker("network", "create", name)
    try:
        address = docker("network", "inspect", name, "--format", "{{(index .IPAM.Config 0).Gateway}}")
        with scripted_server(host=address) as running:
            yield running
    finally:
        docker("network", "rm", name)


@pytest.mark.skipif(not docker_has(IMAGE), reason=NO_DOCKER)
@pytest.mark.skipif(os.geteuid() != 0, reason="the gateway network's firewall needs root (iptables)")
def test_with_run_disabled_a_container_reaches_the_gateway_and_nothing_else(
    pytester: pytest.Pytester, server: ScriptedServer, decoy: ScriptedServer
) -> None:
    server.push(text("from the model", prompt_tokens=12, completion_tokens=4))
    request = gateway_request(
        server,
        {"command": ["sh", "-c", SH_AGENT], "env": {"DECOY_URL": decoy.base_url}},
        environment={"id": "docker", "params": {"image": IMAGE}, "network": {"run": "disabled"}},
        execution={"keep_environment": True},
    )
    write_config(pytester, [request])
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1)
    run_id = run_dir(pytester).name
    (container,) = docker("ps", "-aq", "--filter", f"label=agentcompass.run={run_id}").split()
    try:
        contents = changed_files(container)  # the image's own files cannot hold a key of this run
        networks = json.loads(docker("inspect", container, "--format", "{{json .NetworkSettings.Networks}}"))
    finally:
        docker("rm", "-f", container)
    environment = contents["/work/env.txt"].decode()
    assert "OPENAI_API_KEY=agc-" in environment and "OPENAI_BASE_URL=http://" in environment
    assert not [name for name, data in contents.items() if KEY.encode() in data]  # in no file, env.txt included
    record = detail(pytester)
    assert record["output"].split() == ["gateway=reached", "decoy=unreachable"]
    assert (
        record["metadata"]["usage"]
        == server.reported()
        == {
            "calls": 1,
            "prompt_tokens": 12,
            "completion_tokens": 4,
            "total_tokens": 16,
        }
    )
    assert decoy.requests == []
    assert set(networks) <= {"bridge"}  # the gateway's network was left after the run phase
    assert docker("network", "ls", "-q", "--filter", f"label=agentcompass.run={run_id}") == ""
    rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True, check=True).stdout
    assert f"agentcompass-gw:{run_id}" not in rules
    assert KEY.encode() not in written_anywhere(pytester.path)


@pytest.mark.skipif(not docker_has(IMAGE), reason=NO_DOCKER)
def test_the_next_run_sweeps_the_gateway_network_a_killed_run_left(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    call = 'curl -sf -o /dev/null -H "Authorization: Bearer $OPENAI_API_KEY" -d {} $OPENAI_BASE_URL/chat/completions'
    agent = f"{call}; sleep 600"
    request = gateway_request(
        server,
        {"command": ["sh", "-c", agent]},
        environment={"id": "docker", "params": {"image": IMAGE}, "network": {"run": "disabled"}},
    )
    write_config(pytester, [request])
    process = start_pytest(pytester, own_group=True)
    try:
        server.wait_until(lambda: len(server.requests) == 1)  # the agent is inside its grant
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    run_id = run_dir(pytester).name
    assert docker("network", "ls", "-q", "--filter", f"label=agentcompass.run={run_id}") != ""
    request["harness"]["params"]["command"] = "sh -c 'printf hi > hello.txt'"  # another config: a new run
    write_config(pytester, [request])
    result = pytester.runpytest_subprocess(*RUN)
    result.assert_outcomes(passed=1)
    assert docker("network", "ls", "-q", "--filter", f"label=agentcompass.run={run_id}") == ""
    assert docker("ps", "-aq", "--filter", f"label=agentcompass.run={run_id}") == ""
    rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True, check=False).stdout
    assert f"agentcompass-gw:{run_id}" not in rules
    result.stdout.fnmatch_lines([f"*removed * left behind by run {run_id}*"])


NO_ROUTE_PROVIDER = """\
from pytest_agentcompass import BaseEnvironment


class NoRoute(BaseEnvironment):
    id = "no-route"

    async def open(self, config):
        raise AssertionError("never opened: the request fails its preflight")
"""


def test_an_environment_without_a_route_to_the_gateway_fails_preflight_once(
    pytester: pytest.Pytester, server: ScriptedServer
) -> None:
    pytester.makepyfile(no_route_provider=NO_ROUTE_PROVIDER)
    request = gateway_request(server, {"command": "true"}, environment={"id": "no_route_provider.py:NoRoute"}, n=2)
    fails_preflight(pytester, request, "*environment 'no_route_provider.py:NoRoute' gives its sessions no route*")
