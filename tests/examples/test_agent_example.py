"""example_suites/agent runs as documented, against a loopback server playing the model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openai_server import Reply, ScriptedServer, answer, scripted_server, tool_call

pytest.importorskip("openai")
ROOT = Path(__file__).parent.parent.parent
SOLUTIONS = {
    "greeting.txt": "echo 'hello, world' > greeting.txt",
    "server.log": "grep -c ERROR server.log > answer.txt",
    "add.sh": "sed -i 's/-/+/' add.sh && sh add.sh 3 4",
}


def solver(body: dict[str, Any]) -> Reply:
    """One command per task, then a final answer."""
    messages = body["messages"]
    if any(m["role"] == "tool" for m in messages):
        return answer("done")
    prompt = messages[1]["content"]
    return tool_call(next(command for key, command in SOLUTIONS.items() if key in prompt))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with scripted_server(solver) as running:
        yield running


def test_agent_example(pytester: pytest.Pytester, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "example_suites" / "agent", pytester.path / "agent")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-example-test-key")
    monkeypatch.setenv("OPENAI_MODEL", "example-model")
    result = pytester.runpytest("--agentcompass=agent/agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*usage: 6 model calls, 90 prompt + 39 completion = 129 tokens*"])
    assert {b["model"] for b in server.bodies()} == {"example-model"}
    (run_dir,) = (pytester.path / "agent/.agentcompass/runs/shell-agent").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["passed"] == 3 and summary["usage"]["calls"] == 6
