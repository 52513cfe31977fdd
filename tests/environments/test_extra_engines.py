"""The extra-engine helper of the pool tests leaves nothing behind, even after a killed test session."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from engines import _process_key, _sweep_dead_sessions

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)


def _netns() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


@needs_netns
def test_a_killed_sessions_engines_are_swept_and_a_live_ones_kept() -> None:
    tag = uuid.uuid4().hex[:8]
    dead, live, young = (Path(f"/tmp/acpool-zz{kind}{tag}") for kind in ("dead", "live", "young"))
    for root in (dead, live, young):
        (root / "e0").mkdir(parents=True)
        subprocess.run(["ip", "netns", "add", f"{root.name}-0"], check=True)
    dead_child = subprocess.Popen(["true"])
    dead_child.wait()
    (dead / "owner").write_text(_process_key(os.getpid()).replace(str(os.getpid()), str(dead_child.pid), 1))
    (live / "owner").write_text(_process_key(os.getpid()))
    # ``young`` has no owner yet (a session between making its folder and writing it): kept.
    try:
        _sweep_dead_sessions()
        assert not dead.exists() and f"{dead.name}-0" not in _netns()
        for kept in (live, young):
            assert kept.is_dir() and f"{kept.name}-0" in _netns()
    finally:
        for root in (dead, live, young):
            subprocess.run(["ip", "netns", "del", f"{root.name}-0"], capture_output=True, check=False)
            shutil.rmtree(root, ignore_errors=True)
