"""Why a built-in agent failed, read from its own JSON-lines report (its stdout), in each agent's shape."""

from __future__ import annotations

import json

import pytest

from pytest_agentcompass.harnesses.agents import ClaudeCodeHarness, CodexHarness, GeminiCliHarness, OpenCodeHarness
from pytest_agentcompass.harnesses.agents.base import AgentHarness


def lines(*events: dict[str, object]) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


@pytest.mark.parametrize(
    ("harness", "report", "error"),
    [
        (
            ClaudeCodeHarness,
            lines(
                {"type": "system", "subtype": "init"},
                {"type": "result", "subtype": "success", "is_error": True, "result": "API Error: 401 bad token"},
            ),
            "API Error: 401 bad token",
        ),
        (
            ClaudeCodeHarness,
            lines({"type": "result", "subtype": "error_max_turns", "is_error": True, "usage": {}}),
            "error_max_turns",
        ),
        (
            CodexHarness,
            lines(
                {"type": "thread.started"},
                {"type": "error", "message": "stream disconnected before completion"},
                {"type": "turn.failed", "error": {"message": "stream disconnected before completion"}},
            ),
            "stream disconnected before completion",
        ),
        (
            OpenCodeHarness,
            lines({"type": "error", "error": {"name": "APIError", "data": {"message": "model not found: m"}}}),
            "model not found: m",
        ),
        (
            GeminiCliHarness,
            lines(
                {"type": "init"},
                {"type": "result", "status": "error", "error": {"type": "FatalError", "message": "quota spent"}},
            ),
            "quota spent",
        ),
    ],
    ids=["claude-code", "claude-code-kind", "codex", "opencode", "gemini-cli"],
)
def test_an_agent_s_reported_error_is_read(harness: type[AgentHarness], report: str, error: str) -> None:
    assert harness().parse_report(report).error == error


@pytest.mark.parametrize("harness", [ClaudeCodeHarness, CodexHarness, OpenCodeHarness, GeminiCliHarness])
def test_a_report_without_an_error_event_names_none(harness: type[AgentHarness]) -> None:
    report = lines({"type": "result", "subtype": "success", "is_error": False, "result": "done", "status": "success"})
    assert harness().parse_report(report).error is None
