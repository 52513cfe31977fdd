"""The built-in agent CLI harnesses and the base a new one subclasses.

Names load on first use: a run that uses none of them does not import them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import AgentHarness, AgentParams, AgentReport, AgentRun, ModelEndpoint, json_lines, untar
    from .claude_code import ClaudeCodeHarness
    from .codex import CodexHarness
    from .gemini_cli import GeminiCliHarness
    from .mini_swe_agent import MiniSweAgentHarness
    from .opencode import OpenCodeHarness

__all__ = [
    "AGENTS",
    "AgentHarness",
    "AgentParams",
    "AgentReport",
    "AgentRun",
    "ClaudeCodeHarness",
    "CodexHarness",
    "GeminiCliHarness",
    "MiniSweAgentHarness",
    "ModelEndpoint",
    "OpenCodeHarness",
    "json_lines",
    "untar",
]

#: Harness id -> (module, class) of every built-in agent CLI.
AGENTS = {
    "claude-code": ("claude_code", "ClaudeCodeHarness"),
    "codex": ("codex", "CodexHarness"),
    "gemini-cli": ("gemini_cli", "GeminiCliHarness"),
    "opencode": ("opencode", "OpenCodeHarness"),
    "mini-swe-agent": ("mini_swe_agent", "MiniSweAgentHarness"),
}
_HOMES = {
    **{cls: module for module, cls in AGENTS.values()},
    "AgentHarness": "base",
    "AgentParams": "base",
    "AgentReport": "base",
    "AgentRun": "base",
    "untar": "base",
    "json_lines": "base",
    "ModelEndpoint": "base",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
