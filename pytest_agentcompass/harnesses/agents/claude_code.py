"""``claude-code``: Anthropic's Claude Code, the native binary of its Linux x64 npm package."""

from __future__ import annotations

from ...models.usage import Usage
from .base import AgentHarness, AgentReport, AgentRun, json_lines, untar
from .cache import NpmPackage, PackageSource, tarball_name

__all__ = ["ClaudeCodeHarness"]

_PACKAGE = "@anthropic-ai/claude-code-linux-x64"


class ClaudeCodeHarness(AgentHarness):
    """``claude -p`` with every tool allowed (``IS_SANDBOX=1`` lets root skip the permission
    prompts), streaming JSON on stdout, its sessions in ``/logs/agent/claude-code``."""

    id = "claude-code"
    version = "2.1.332"
    protocol = "anthropic"
    binary = "claude"

    def packages(self, version: str) -> list[PackageSource]:
        return [NpmPackage(_PACKAGE, version)]

    def install_script(self, version: str) -> str:
        return untar(tarball_name(_PACKAGE, version), "package/claude")

    def command(self, run: AgentRun) -> list[str]:
        return [
            run.bin(self.binary), "-p", run.prompt, "--model", run.model, "--output-format", "stream-json",
            "--verbose", "--dangerously-skip-permissions",
        ]  # fmt: skip

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": run.endpoint.base_url,
            "ANTHROPIC_API_KEY": run.endpoint.api_key,
            "ANTHROPIC_MODEL": run.model,
            "ANTHROPIC_SMALL_FAST_MODEL": run.model,
            "CLAUDE_CONFIG_DIR": run.home,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "IS_SANDBOX": "1",
        }

    def parse_report(self, text: str) -> AgentReport:
        """The last ``{"type": "result"}`` line: its usage, cost and answer."""
        results = [event for event in json_lines(text) if event.get("type") == "result"]
        if results:
            result = results[-1]
            usage = result.get("usage") or {}
            prompt = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens",
                                                           "cache_creation_input_tokens"))  # fmt: skip
            counted = Usage(calls=int(result.get("num_turns") or 0))
            counted.prompt_tokens, counted.completion_tokens = prompt, int(usage.get("output_tokens") or 0)
            counted.total_tokens = counted.prompt_tokens + counted.completion_tokens
            counted.cost = result.get("total_cost_usd")
            if result.get("is_error"):  # its reason in ``result``, else only its kind (``error_max_turns``)
                return AgentReport(counted, error=str(result.get("result") or result.get("subtype") or "error"))
            return AgentReport(counted, result.get("result"))
        return AgentReport()
