"""An install recipe: what a provider needs to install one agent version into an image.

Plain data, so it travels in ``ExecutionPlan.environment["agent_install"]``
(recorded with the plan) from the harness that knows the agent to the
provider that knows the containers. The install writes only under
``prefix``: the derived image is the task image plus that one folder.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["AGENTS_ROOT", "MARKER", "PKGS_DIR", "AgentInstall"]

#: Where agents are installed in an image (one folder per agent and version).
AGENTS_ROOT = "/opt/agentcompass/agents"
#: Where the install finds the cached files (read-only).
PKGS_DIR = "/opt/agentcompass/pkgs"
#: Written into the prefix once the install succeeded: what is installed, from what.
MARKER = ".agentcompass-install.json"


@dataclass(frozen=True)
class AgentInstall:
    """One agent version's install.

    :param files: The host folder holding the cached files (a cache set).
    :param files_digest: Its content digest: the install's identity, not the path.
    :param script: ``sh`` commands run as root in ``/`` with ``$PKGS`` (the files, read-only)
        and ``$PREFIX`` (where everything must go); offline, within ``timeout`` seconds.
    """

    agent: str
    version: str
    files: str
    files_digest: str
    script: str
    timeout: float = 900.0

    @property
    def prefix(self) -> str:
        return f"{AGENTS_ROOT}/{self.agent}-{self.version}"

    @property
    def key(self) -> str:
        """A digest of everything that makes the installed folder what it is."""
        what = json.dumps([self.agent, self.version, self.files_digest, self.script, self.prefix])
        return hashlib.sha256(what.encode()).hexdigest()[:24]

    def wrapper(self, pkgs: str = PKGS_DIR) -> str:
        """The whole install as one ``sh -c`` text: the script, then the marker (only if it succeeded)."""
        marker = json.dumps({"agent": self.agent, "version": self.version, "key": self.key})
        return "\n".join(
            [
                "set -eu",
                f"PKGS={shlex.quote(pkgs)}; PREFIX={shlex.quote(self.prefix)}; export PKGS PREFIX",
                'rm -rf "$PREFIX"; mkdir -p "$PREFIX"; cd /',
                self.script.strip(),
                f'printf "%s\\n" {shlex.quote(marker)} > "$PREFIX/{MARKER}"',
            ]
        )

    def to_params(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_params(cls, value: Mapping[str, Any]) -> AgentInstall:
        fields = ("agent", "version", "files", "files_digest", "script")
        return cls(**{k: str(value[k]) for k in fields}, timeout=float(value.get("timeout") or 900.0))
