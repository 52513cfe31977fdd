"""Killing a pytest process the way a crash does, for the kill -9 tests of several layers."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from pytest_agentcompass.environments.markers import descendants


def kill_with_its_reapers(pid: int) -> None:
    """SIGKILL process ``pid`` and the reapers of its execs (they live in a session of their own)."""
    os.kill(pid, signal.SIGSTOP)  # frozen first: it must not see a reaper die and carry on
    for child in descendants(pid):
        try:
            if b"_reaper.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    os.kill(pid, signal.SIGKILL)
