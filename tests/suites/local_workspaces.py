"""For the ``local`` workspace tests: a provider and a session on a base folder, and a folder that
refuses removals."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_agentcompass import EnvironmentSpec, ExecutionPlan, LocalEnvironment
from pytest_agentcompass.environments.local import LocalSession


def lock(directory: Path) -> None:
    """Make unlinking entries of ``directory`` fail: immutable as root (who ignores modes), read-only otherwise."""
    if os.geteuid() != 0:
        directory.chmod(0o500)
        return
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this file system cannot make a directory immutable: {done.stderr.strip()}")


def unlock(directory: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], capture_output=True, check=False)
    else:
        directory.chmod(0o700)


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    lock(directory)
    try:
        yield
    finally:
        unlock(directory)


def local_provider(base: Path) -> LocalEnvironment:
    return LocalEnvironment(EnvironmentSpec(params={"base_dir": str(base)}))


async def open_session(base: Path | LocalEnvironment) -> LocalSession:
    provider = base if isinstance(base, LocalEnvironment) else local_provider(base)
    plan = ExecutionPlan(task_id="t", attempt_index=0, evaluation_environment_mode="reuse")
    session = await provider.open(provider.build_config(plan, "task"))
    assert isinstance(session, LocalSession)
    return session
