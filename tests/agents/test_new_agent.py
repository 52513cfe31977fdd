"""A sixth agent is one small class (the example of README's "Agent CLIs" and docs/api.md), fetched
from an npm registry of our own, installed once, run through the gateway; a broken install is a
setup error with its log tail, not retried into new installs; no registry and no cache is one message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from store_writes import not_through_the_store, writes_under

from agent_scripts import COMMAND, IMAGE, NO_AGENT_DOCKER, agent_task, offline
from conftest import docker_has, write_config
from containers import docker
from model_upstream import ScriptedServer, Seen, Turn, scripted_server, text, tool
from registries import LocalRegistry, local_registry, npm_tarball

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.skipif(not docker_has(IMAGE), reason=NO_AGENT_DOCKER)

KEY = "sk-sixth-agent-upstream-key-27d4"
RUN = ("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
AGENT_NAME = "acme-test-agent"

#: The agent CLI itself: a small loop of chat completions with one `bash` tool (python3 of the image).
AGENT = """\
#!/usr/bin/env python3
import json, os, subprocess, sys, urllib.request
if sys.argv[1:] == ["--version"]:
    sys.exit(print("my-agent 1.0.0"))
failure = os.environ.get("MY_AGENT_FAILS")
if failure == "in-its-report":  # as codex, claude and opencode do: the error is an event on stdout
    print("warning: no terminal, colours off", file=sys.stderr)
    print(json.dumps({"type": "error", "message": "the model refused: quota of org-7 spent"}))
    sys.exit(1)
if failure == "on-stdout":  # progress on stdout, a harmless warning on stderr, then the error on stdout
    print("DeprecationWarning: punycode is deprecated", file=sys.stderr)
    print("step 1", "step 2", "Error: the workspace /app is read-only", sep=chr(10))
    sys.exit(1)
if failure == "on-stderr":  # lots of progress on stdout, the error on stderr
    print(*(f"step {i}" for i in range(500)), sep=chr(10))
    sys.exit(chr(10).join(["Traceback (most recent call last):", "RuntimeError: the model endpoint closed the stream"]))
base, key, model = os.environ["MY_AGENT_BASE_URL"], os.environ["MY_AGENT_KEY"], os.environ["MY_AGENT_MODEL"]
tools = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]
messages = [{"role": "user", "content": sys.argv[1]}]
for _ in range(5):
    body = json.dumps({"model": model, "messages": messages, "tools": tools}).encode()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(base + "/chat/completions", body, headers)) as answer:
        message = json.load(answer)["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        sys.exit(print(message["content"]))
    for call in message["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
"""

#: The harness: README's example ("Another agent"), but the package's name.
HARNESS = f'''\
from pytest_agentcompass import AgentHarness, AgentReport, AgentRun, NpmPackage, tarball_name, untar
from pytest_agentcompass.harnesses.agents import json_lines


class MyAgent(AgentHarness):
    id = "{AGENT_NAME}"
    version = "1.0.0"
    protocol = "openai_chat"
    binary = "my-agent"

    def packages(self, version: str) -> list:
        return [NpmPackage("@acme/my-agent", version)]

    def install_script(self, version: str) -> str:
        return untar(tarball_name("@acme/my-agent", version), "package/bin/my-agent", strip=2)

    def command(self, run: AgentRun) -> list[str]:
        return [run.bin(self.binary), run.prompt]

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {{"MY_AGENT_BASE_URL": run.endpoint.base_url, "MY_AGENT_KEY": run.endpoint.api_key,
                "MY_AGENT_MODEL": run.model}}


class Fails(MyAgent):
    """The agent fails in one of three ways (AGENT's ``MY_AGENT_FAILS``)."""
    how = ""

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {{**super().environment(run), "MY_AGENT_FAILS": self.how}}


class FailsInItsReport(Fails):
    how = "in-its-report"

    def parse_report(self, text: str) -> AgentReport:
        errors = [event["message"] for event in json_lines(text) if event.get("type") == "error"]
        return AgentReport(error=errors[-1] if errors else None)


class FailsOnStdout(Fails):
    how = "on-stdout"
    error_stream = "stdout"


class FailsOnStderr(Fails):
    how = "on-stderr"


class OtherAgent(MyAgent):
    """The same agent, published under another name."""
    id = "acme-other-agent"

    def packages(self, version: str) -> list:
        return [NpmPackage("@acme/other-agent", version)]

    def install_script(self, version: str) -> str:
        return untar(tarball_name("@acme/other-agent", version), "package/bin/my-agent", strip=2)


class Broken(MyAgent):
    def install_script(self, version: str) -> str:
        return "echo unpacking; echo 'cannot unpack my-agent: disk full' >&2; exit 7"
'''


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LocalRegistry]:
    with local_registry() as served:
        served.add_npm("@acme/my-agent", "1.0.0", npm_tarball({"bin/my-agent": AGENT}, {"bin/my-agent": 0o755}))
        monkeypatch.setenv("npm_config_registry", served.npm_url)
        monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
        yield served
    # Its tarball differs per session (gzip's time stamp): the images made from it go with the test.
    for agent in (AGENT_NAME, "acme-other-agent"):
        for image in docker("images", "-q", "--filter", f"label=agentcompass.agent={agent}").split():
            docker("rmi", "-f", image)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    monkeypatch.setenv("SIXTH_UPSTREAM_KEY", KEY)

    def respond(seen: Seen) -> Turn:
        return tool("bash", {"command": COMMAND}) if seen.tool_results() == 0 else text("done")

    with scripted_server(responder=respond, api_key=KEY) as running:
        yield running


def config(pytester: pytest.Pytester, server: ScriptedServer, harness: str, **execution: Any) -> None:
    (pytester.path / "agent6.py").write_text(HARNESS)
    agent_task(pytester.path / "tasks")
    write_config(
        pytester,
        [
            {
                "name": "sixth",
                "benchmark": {"id": "harbor", "params": {"path": "tasks"}},
                "harness": {"id": f"agent6.py:{harness}", "params": {"cache_dir": str(pytester.path / "cache")}},
                "environment": {"id": "docker", "network": {"run": "disabled"}},
                "model": {"id": "m", "params": {"base_url": server.base_url, "api_key": "${SIXTH_UPSTREAM_KEY}"}},
                "execution": {"retry_backoff_seconds": 0, **execution},
            }
        ],
    )


def detail(pytester: pytest.Pytester) -> dict[str, Any]:
    (run,) = (pytester.path / "runs" / "sixth").iterdir()
    return json.loads((run / "details" / "hello-agent.json").read_text())  # type: ignore[no-any-return]


def test_a_sixth_agent_is_one_small_class(
    pytester: pytest.Pytester, registry: LocalRegistry, server: ScriptedServer
) -> None:
    config(pytester, server, "MyAgent")
    with writes_under(pytester.path / "runs") as writes:
        pytester.runpytest(*RUN).assert_outcomes(passed=1)
    assert not_through_the_store(writes) == [], "the install, the gateway and the agent write through the store"
    record = detail(pytester)
    assert record["metadata"]["agent_install"]["installed"] is True
    assert record["metadata"]["usage"] == server.reported() == {
        "calls": 2, "prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30,
    }  # fmt: skip
    assert record["output"] == "done"


def test_a_broken_install_is_a_setup_error_with_its_log_tail_and_is_not_repeated(
    pytester: pytest.Pytester, registry: LocalRegistry, server: ScriptedServer
) -> None:
    config(pytester, server, "Broken", max_retries=2)
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*installing acme-test-agent 1.0.0 into image*exited with 7*"])
    record = detail(pytester)
    assert record["status"] == "environment_error"
    assert "cannot unpack my-agent: disk full" in record["error"]
    (run,) = (pytester.path / "runs" / "sixth").iterdir()
    logs = sorted(p.relative_to(run).as_posix() for p in run.rglob("agent-install/*.log"))
    assert logs == ["artifacts/hello-agent/attempt-0/agent-install/acme-test-agent-1.0.0.log"]  # one install
    assert record["retries"] == 2 and server.requests == []


def test_without_a_registry_an_empty_cache_is_one_clear_message(
    pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    config(pytester, server, "MyAgent")
    offline(monkeypatch)
    result = pytester.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    cache = pytester.path / "cache"
    result.stdout.fnmatch_lines(
        [
            f"*harness '{AGENT_NAME}': the packages of {AGENT_NAME} 1.0.0 are not in the cache at {cache}*",
            "*ECONNREFUSED*",
            "*Fill the cache where a registry is reachable (a run there fetches them); without a registry, "
            f"copy a cache folder filled there to {cache}*",
        ]
    )
    assert "Traceback" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()


#: Each failing agent, and the start of the error its task ends with (where the agent said why).
FAILURES = {
    "FailsInItsReport": "(its report): the model refused: quota of org-7 spent",
    "FailsOnStdout": "(stdout): step 1\nstep 2\nError: the workspace /app is read-only",
    "FailsOnStderr": "(stderr): Traceback (most recent call last):\nRuntimeError: the model endpoint closed",
}


def test_a_failing_agent_s_error_is_taken_from_where_the_agent_says_it(
    pytester: pytest.Pytester, registry: LocalRegistry, server: ScriptedServer
) -> None:
    """Agents say why they failed in different places: the error showed stderr whenever it had anything
    (a warning), and never the error event of an agent's JSON report on stdout. One request per agent,
    in one session (the agent is installed once for all three)."""
    config(pytester, server, "MyAgent")
    data = yaml.safe_load((pytester.path / "agentcompass.yaml").read_text())
    requests = []
    for harness in FAILURES:
        request = {**data["requests"][0], "name": harness}
        request["harness"] = {**request["harness"], "id": f"agent6.py:{harness}"}
        requests.append(request)
    write_config(pytester, requests)
    pytester.runpytest(*RUN).assert_outcomes(errors=3)
    for harness, said in FAILURES.items():
        (run,) = (pytester.path / "runs" / harness).iterdir()
        record = json.loads((run / "details" / "hello-agent.json").read_text())
        assert record["status"] == "inference_error"
        assert record["error"].startswith(f"{AGENT_NAME} exited with 1 {said}"), record["error"]
        assert "warning" not in record["error"].lower()


def test_the_agents_of_several_requests_are_fetched_at_once(
    pytester: pytest.Pytester, registry: LocalRegistry, server: ScriptedServer
) -> None:
    """Two requests, two agents, an empty cache: the preflights fetched one agent after the other."""
    registry.add_npm("@acme/other-agent", "1.0.0", npm_tarball({"bin/my-agent": AGENT}, {"bin/my-agent": 0o755}))
    registry.meet = 2  # each package's metadata is held until both are asked for
    config(pytester, server, "MyAgent")
    data = yaml.safe_load((pytester.path / "agentcompass.yaml").read_text())
    other = {**data["requests"][0], "name": "other"}
    other["harness"] = {**other["harness"], "id": "agent6.py:OtherAgent"}
    write_config(pytester, [data["requests"][0], other])
    pytester.runpytest(*RUN).assert_outcomes(passed=2)
    assert registry.met, "the second agent's package was asked for only once the first one was fetched"
