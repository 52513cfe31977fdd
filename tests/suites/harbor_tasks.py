"""Writing small Harbor task directories for the tests, and reading what a run left."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

BUSYBOX = "agentcompass-busybox:test"
#: A busybox image with the ``/bin/bash`` shim Harbor's ``bash /tests/test.sh`` needs.
BUSYBOX_DOCKERFILE = f"""FROM {BUSYBOX}
RUN printf '#!/bin/sh\\nexec /bin/sh "$@"\\n' > /bin/bash && chmod 755 /bin/bash
WORKDIR /app
"""
PASS_TEST = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"

TOML = """version = "1.0"

[metadata]
category = "{category}"
tags = {tags}

[verifier]
timeout_sec = {verifier_timeout}

[agent]
timeout_sec = 60.0

[environment]
build_timeout_sec = {build_timeout}
{environment}
"""


def require_images(*images: str, hint: str = "run scripts/start-docker.sh") -> None:
    """Skip the calling test module unless the engine has ``images`` (in CI, fail: CI must provide them)."""
    probe = subprocess.run(["docker", "image", "inspect", *images], capture_output=True, check=False)
    if probe.returncode == 0:
        return
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must provide the Docker engine and the images {', '.join(images)}: {hint}")
    import pytest

    pytest.skip(f"no Docker engine with {', '.join(images)} ({hint})", allow_module_level=True)


def write_task(
    root: Path,
    name: str,
    *,
    test: str = PASS_TEST,
    solve: str | None = "#!/bin/bash\ntrue\n",
    dockerfile: str | None = BUSYBOX_DOCKERFILE,
    toml: str | None = None,
    environment: str = "",
    category: str = "testing",
    tags: list[str] | None = None,
    verifier_timeout: float = 60.0,
    build_timeout: float = 300.0,
    files: dict[str, str] | None = None,
    tests_files: dict[str, str] | None = None,
    unique: bool = False,
) -> Path:
    """A task directory ``root/name``; ``unique`` gives its image a context no other test shares."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text(f"Task {name}.\n")
    if toml is None:
        toml = TOML.format(
            category=category,
            tags=json.dumps(tags or []),
            verifier_timeout=verifier_timeout,
            build_timeout=build_timeout,
            environment=environment,
        )
    (task / "task.toml").write_text(toml)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    if unique:
        (task / "environment" / "unique.txt").write_text(uuid.uuid4().hex)
    for rel, content in (files or {}).items():
        (task / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / rel).write_text(content)
    (task / "tests" / "test.sh").write_text(test)
    for rel, content in (tests_files or {}).items():
        (task / "tests" / rel).write_text(content)
    if solve is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solve)
    return task


def harbor_request(name: str, path: Path | str, harness: str = "oracle", **extra: Any) -> dict[str, Any]:
    params = extra.pop("params", {})
    harness_ref: dict[str, Any] = {
        "id": harness,
        **({"params": extra.pop("harness_params")} if "harness_params" in extra else {}),
    }
    return {
        "name": name,
        "benchmark": {"id": "harbor", "params": {"path": str(path), **params}},
        "harness": harness_ref,
        "environment": {"id": "docker", **extra.pop("environment", {})},
        "execution": {"retry_backoff_seconds": 0, **extra.pop("execution", {})},
        **extra,
    }


def run_dir(base: Path, request: str) -> Path:
    dirs = sorted(p for p in (base / "runs" / request).iterdir() if p.is_dir())
    return dirs[-1]


def details(base: Path, request: str) -> dict[str, dict[str, Any]]:
    folder = run_dir(base, request) / "details"
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


def docker_lines(*args: str) -> list[str]:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout
    return out.split()


def containers_of(run_id: str) -> list[str]:
    return docker_lines("ps", "-aq", "--filter", f"label=agentcompass.run={run_id}")


def task_image_tags() -> set[str]:
    return set(docker_lines("images", "agentcompass-task", "--format", "{{.Repository}}:{{.Tag}}"))


def remove_images(tags: set[str]) -> None:
    if tags:
        subprocess.run(["docker", "rmi", "-f", *sorted(tags)], capture_output=True, check=False)
