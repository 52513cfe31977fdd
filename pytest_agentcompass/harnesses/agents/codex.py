"""``codex``: OpenAI's Codex CLI, the static binary of its Linux x64 npm package (Responses API only)."""

from __future__ import annotations

import json

from ...models.usage import Usage
from .base import AgentHarness, AgentReport, AgentRun, event_error, json_lines, untar
from .cache import NpmPackage, PackageSource, tarball_name

__all__ = ["CodexHarness"]

_VENDOR = "package/vendor/x86_64-unknown-linux-musl"


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


class CodexHarness(AgentHarness):
    """``codex exec --json`` with approvals and its sandbox off (the container is the sandbox),
    its provider set in ``$CODEX_HOME/config.toml`` (``/logs/agent/codex``)."""

    id = "codex"
    version = "0.171.0"
    protocol = "openai_responses"
    binary = "codex"

    def packages(self, version: str) -> list[PackageSource]:
        return [NpmPackage("@openai/codex", f"{version}-linux-x64")]

    def install_script(self, version: str) -> str:
        tarball = tarball_name("@openai/codex", f"{version}-linux-x64")
        return untar(tarball, f"{_VENDOR}/bin/codex", f"{_VENDOR}/codex-path/rg", strip=4)

    def command(self, run: AgentRun) -> list[str]:
        return [
            run.bin(self.binary), "exec", "--json", "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox", "--model", run.model, run.prompt,
        ]  # fmt: skip

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {"CODEX_HOME": run.home, "AGENTCOMPASS_MODEL_KEY": run.endpoint.api_key}

    def files(self, run: AgentRun) -> dict[str, str]:
        # ``features.plugins = false``: else codex 0.171 syncs its curated plugins in the background
        # (``git ls-remote https://github.com/openai/plugins.git``), a child that outlives ``codex
        # exec`` (flagged by the agent-processes integrity check) and reaches past the gateway.
        config = f"""model = {_toml(run.model)}
model_provider = "agentcompass"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.agentcompass]
name = "agentcompass"
base_url = {_toml(run.endpoint.base_url)}
env_key = "AGENTCOMPASS_MODEL_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
"""
        return {f"{run.home}/config.toml": config}

    def parse_report(self, text: str) -> AgentReport:
        """``turn.completed`` usages, summed; the last ``agent_message``."""
        usage, answer, error = Usage(), None, None
        for event in json_lines(text):
            if event.get("type") in ("error", "turn.failed"):
                error = event_error(event) or error
            if event.get("type") == "turn.completed":
                counts = event.get("usage") or {}
                usage.add_call(int(counts.get("input_tokens") or 0), int(counts.get("output_tokens") or 0))
            item = event.get("item") or {}
            if event.get("type") == "item.completed" and item.get("type") == "agent_message":
                answer = item.get("text")
        return AgentReport(usage if usage.calls else None, answer, error=error)
