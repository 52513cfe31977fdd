"""``opencode``: OpenCode, the native binary of its ``opencode-linux-x64`` npm package,
talking chat completions through its OpenAI-compatible provider."""

from __future__ import annotations

import json

from ...models.usage import Usage
from .base import AgentHarness, AgentReport, AgentRun, event_error, json_lines, untar
from .cache import NpmPackage, PackageSource, tarball_name

__all__ = ["OpenCodeHarness"]

_PACKAGE = "opencode-linux-x64"


class OpenCodeHarness(AgentHarness):
    """``opencode run --format json`` with every permission allowed, its config in
    ``$OPENCODE_CONFIG_CONTENT``, its data and logs in ``/logs/agent/opencode``."""

    id = "opencode"
    version = "1.18.33"
    protocol = "openai_chat"
    binary = "opencode"

    def packages(self, version: str) -> list[PackageSource]:
        return [NpmPackage(_PACKAGE, version)]

    def install_script(self, version: str) -> str:
        return untar(tarball_name(_PACKAGE, version), "package/bin/opencode", strip=2)

    def command(self, run: AgentRun) -> list[str]:
        return [run.bin(self.binary), "run", "--format", "json", "--model", f"agentcompass/{run.model}", run.prompt]

    def environment(self, run: AgentRun) -> dict[str, str]:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "permission": "allow",
            "autoupdate": False,
            "share": "disabled",
            "model": f"agentcompass/{run.model}",
            "provider": {
                "agentcompass": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "agentcompass",
                    "options": {"baseURL": run.endpoint.base_url, "apiKey": "{env:AGENTCOMPASS_MODEL_KEY}"},
                    "models": {run.model: {"name": run.model}},
                }
            },
        }
        return {
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
            "AGENTCOMPASS_MODEL_KEY": run.endpoint.api_key,
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            **{f"XDG_{kind}_HOME": f"{run.home}/{kind.lower()}" for kind in ("CONFIG", "DATA", "STATE", "CACHE")},
        }

    def parse_report(self, text: str) -> AgentReport:
        """``step_finish`` tokens, summed (its title request is not among them); the last text part."""
        usage, answer, error = Usage(), None, None
        for event in json_lines(text):
            if event.get("type") == "error":
                error = event_error(event) or error
            part = event.get("part") or {}
            if event.get("type") == "step_finish":
                tokens = part.get("tokens") or {}
                usage.add_call(int(tokens.get("input") or 0), int(tokens.get("output") or 0))
            if event.get("type") == "text" and part.get("text"):
                answer = str(part["text"])
        return AgentReport(usage if usage.calls else None, answer, error=error)
