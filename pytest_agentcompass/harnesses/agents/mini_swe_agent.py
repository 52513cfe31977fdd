"""``mini-swe-agent``: the SWE-agent team's minimal agent, installed from wheels into a venv of
the task image's own ``python3``."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pydantic import Field, field_validator

from ...models.usage import Usage
from .base import AgentHarness, AgentParams, AgentReport, AgentRun
from .cache import PackageSource, PipWheels

__all__ = ["MiniSweAgentHarness", "MiniSweAgentParams"]


class MiniSweAgentParams(AgentParams):
    #: The Python versions (``major.minor``) whose wheels are fetched: the task image's ``python3`` must be one.
    python_versions: list[str] = Field(default_factory=lambda: ["3.10", "3.11", "3.12", "3.13"], min_length=1)

    @field_validator("python_versions")
    @classmethod
    def _versions(cls, value: list[str]) -> list[str]:
        for version in value:
            major, _, minor = version.partition(".")
            if not (major == "3" and minor.isdigit() and int(minor) >= 10):
                raise ValueError(f"{version!r} is not a Python version mini-swe-agent runs on (3.10 or newer)")
        return value


class MiniSweAgentHarness(AgentHarness):
    """``mini -y --exit-immediately`` (no confirmations, ends when the model submits), its
    trajectory in ``/logs/agent/mini-swe-agent/trajectory.json``."""

    id = "mini-swe-agent"
    version = "2.4.6"
    protocol = "openai_chat"
    binary = "mini"
    check_args = ("--help",)
    report_file = "trajectory.json"
    params_model = MiniSweAgentParams

    def packages(self, version: str) -> list[PackageSource]:
        return [PipWheels((f"mini-swe-agent=={version}", "pip"), tuple(self.options.python_versions))]

    def install_script(self, version: str) -> str:
        wanted = " ".join(self.options.python_versions)
        return "\n".join(
            [
                "if ! command -v python3 >/dev/null 2>&1; then",
                "  echo 'mini-swe-agent needs python3 (3.10 or newer) in the task image, which has none' >&2; exit 3",
                "fi",
                "have=$(python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])')",
                f'case " {wanted} " in *" $have "*) ;; *)',
                f"  echo \"the image's python3 is $have; the cache holds mini-swe-agent's wheels for {wanted}:"
                ' add it to harness.params.python_versions" >&2; exit 3;;',
                "esac",
                'python3 -m venv --without-pip "$PREFIX/venv"',
                'pip="$(ls "$PKGS"/pip-*.whl | head -n 1)/pip"  # pip runs from its own wheel',
                '"$PREFIX/venv/bin/python" "$pip" install --quiet --no-input --disable-pip-version-check'
                f' --no-index --find-links "$PKGS" {shlex.quote(f"mini-swe-agent=={version}")}',
                'mkdir -p "$PREFIX/bin" && ln -s ../venv/bin/mini "$PREFIX/bin/mini"',
            ]
        )

    def command(self, run: AgentRun) -> list[str]:
        return [
            run.bin(self.binary), "-y", "--exit-immediately", "--model", f"openai/{run.model}", "--task", run.prompt,
            "--output", f"{run.home}/trajectory.json", "-c", "mini.yaml",
            "-c", f"model.model_kwargs.api_base={run.endpoint.base_url}",
        ]  # fmt: skip

    def environment(self, run: AgentRun) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": run.endpoint.api_key,
            "MSWEA_CONFIGURED": "true",  # else it asks its setup questions
            "MSWEA_GLOBAL_CONFIG_DIR": f"{run.home}/config",
            "MSWEA_COST_TRACKING": "ignore_errors",  # no price for a model it does not know
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no price list download
        }

    def parse_report(self, text: str) -> AgentReport:
        """The trajectory's per-call usage and the submission."""
        if not text.strip():
            return AgentReport()
        data: Any = json.loads(text)
        usage = Usage()
        for message in data.get("messages") or []:
            extra = message.get("extra") if isinstance(message, dict) else None
            counts = ((extra or {}).get("response") or {}).get("usage") if isinstance(extra, dict) else None
            if isinstance(counts, dict):
                usage.add_call(int(counts.get("prompt_tokens") or 0), int(counts.get("completion_tokens") or 0))
        info = data.get("info") or {}
        status = info.get("exit_status")
        extra = {"agent_exit_status": status} if status else {}
        return AgentReport(usage if usage.calls else None, info.get("submission") or status or None, extra)
