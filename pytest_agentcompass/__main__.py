"""``python -m pytest_agentcompass report|compare|agents``: reports outside a pytest session, and the
agent package cache filled ahead (``agents fetch``)."""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:2] == ["agents"]:
        from .harnesses.agents.cli import main as agents

        return agents(sys.argv[2:])
    from .reports.cli import main as reports

    return reports()


if __name__ == "__main__":
    sys.exit(main())
