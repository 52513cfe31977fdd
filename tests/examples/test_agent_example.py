"""example_suites/agent runs as documented, against a loopback server playing the model.

The server "solves" each task with one command chosen from the instruction,
then answers without a tool call; the tasks' own verifiers score the result.
"""

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
    # local.yaml: example_suites/agent/tasks.py
    "greeting.txt": "echo 'hello, world' > greeting.txt",
    "server.log": "grep -c ERROR server.log > answer.txt",
    "add.sh": "sed -i 's/-/+/' add.sh && sh add.sh 3 4",
    # agentcompass.yaml: the Harbor tasks of example_suites/terminal
    "/app/data.txt": "wc -l < data.txt | tr -d ' ' > count.txt",
    "service.conf": "sed -i -e 's/^port=.*/port=8080/' -e 's/^logging=.*/logging=on/' service.conf",
    "Hello, world!": "echo 'Hello, world!' > hello.txt",
    "/app/project": "tar -czf project.tar.gz project",
    "words.txt": "sort -u words.txt > sorted.txt",
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


@pytest.fixture
def example(tmp_path_factory: pytest.TempPathFactory, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Elsewhere than the folder pytest starts in: the configs work from anywhere.
    checkout = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "example_suites" / "agent", checkout / "agent")
    shutil.copytree(ROOT / "example_suites" / "terminal", checkout / "terminal")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-example-test-key")
    monkeypatch.setenv("OPENAI_MODEL", "example-model")
    return checkout / "agent"


def test_local_example(pytester: pytest.Pytester, server: ScriptedServer, example: Path) -> None:
    result = pytester.runpytest(f"--agentcompass={example}/local.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*usage: 6 model calls, 90 prompt + 39 completion = 129 tokens*"])
    assert {b["model"] for b in server.bodies()} == {"example-model"}
    (run_dir,) = (example / ".agentcompass/runs/shell-agent").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["passed"] == 3 and summary["usage"]["calls"] == 6


@pytest.mark.usefixtures("docker_engine")
def test_terminal_tasks_example(pytester: pytest.Pytester, server: ScriptedServer, example: Path) -> None:
    result = pytester.runpytest(f"--agentcompass={example}/agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*usage: 10 model calls, 150 prompt + 65 completion = 215 tokens*"])
    (run_dir,) = (example / ".agentcompass/runs/terminal-shell-agent").iterdir()
    offline = json.loads((run_dir / "details/offline-archive.json").read_text())
    assert offline["metadata"]["stop_reason"] == "answered"
