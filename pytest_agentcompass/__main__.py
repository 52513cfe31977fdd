"""``python -m pytest_agentcompass report|compare``: reports outside a pytest session."""

from __future__ import annotations

import sys

from .reports.cli import main

if __name__ == "__main__":
    sys.exit(main())
