"""Configs for runs of model-calling harnesses against the loopback server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import SUITES, write_config
from openai_server import ScriptedServer

KEY = "sk-agentcompass-test-5f2c9a7e31"
#: Orchestration deadlines a test of the deadline tries in turn: the deadline is what is tested,
#: so it cannot wait for the model calls to start, and on a loaded machine none may start
#: within the first one. A test takes the next until calls were in flight when it struck.
DEADLINES = (1.5, 6.0, 30.0)
FILE_TASKS = f"{SUITES / 'file_tasks.py'}:FileTasks"


def agent_request(
    server: ScriptedServer,
    *,
    harness: str = "shell-agent",
    params: dict[str, Any] | None = None,
    model_params: dict[str, Any] | None = None,
    n: int = 1,
    execution: dict[str, Any] | None = None,
    environment: dict[str, Any] | None = None,
    name: str = "agent",
) -> dict[str, Any]:
    return {
        "name": name,
        "benchmark": {"id": FILE_TASKS, "params": {"n": n}},
        "harness": {"id": harness, "params": params or {}},
        "environment": environment or {"id": "local"},
        "execution": {"retry_backoff_seconds": 0, **(execution or {})},
        "model": {
            "id": "test-model",
            "params": {"base_url": server.base_url, "api_key": KEY, "max_retries": 0, **(model_params or {})},
        },
    }


def write_agent_config(pytester: pytest.Pytester, server: ScriptedServer, **kwargs: Any) -> Path:
    top = {k: kwargs.pop(k) for k in ("task_concurrency", "cleanup_grace_seconds", "timeout_seconds") if k in kwargs}
    return write_config(pytester, [agent_request(server, **kwargs)], **top)


def run_dir(pytester: pytest.Pytester, name: str = "agent") -> Path:
    (found,) = (pytester.path / "runs" / name).iterdir()
    return found


def detail(pytester: pytest.Pytester, task_id: str = "file-0", name: str = "agent") -> dict[str, Any]:
    return json.loads((run_dir(pytester, name) / "details" / f"{task_id}.json").read_text())  # type: ignore[no-any-return]


def trajectory(pytester: pytest.Pytester, record: dict[str, Any], name: str = "agent") -> dict[str, Any]:
    return json.loads((run_dir(pytester, name) / record["artifacts"]["trajectory"]).read_text())  # type: ignore[no-any-return]
