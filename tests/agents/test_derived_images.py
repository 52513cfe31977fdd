"""Derived agent images on the real Docker engine: made once per base image and recipe, clean, nothing left."""

from __future__ import annotations

import asyncio
import io
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass.environments.base import SessionConfig
from pytest_agentcompass.environments.docker_derived import AgentImages, with_agent
from pytest_agentcompass.vocabulary.agent_install import AgentInstall
from pytest_agentcompass.vocabulary.errors import SessionError

from conftest import docker_has

BUSYBOX = "agentcompass-busybox:test"
pytestmark = pytest.mark.skipif(not docker_has(BUSYBOX), reason=f"no Docker engine with {BUSYBOX}")
docker_sdk = pytest.importorskip("docker")

SCRIPT = 'mkdir -p "$PREFIX/bin" && tar -xzf "$PKGS/agent.tgz" -C "$PREFIX/bin" && echo installed "$(cat "$PKGS/note")"'


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def base() -> Iterator[str]:
    """A base image of this test alone (a label makes its id new), removed with what was derived from it."""
    nonce = uuid.uuid4().hex[:12]
    tag = f"agentcompass-test-base:{nonce}"
    client = docker_sdk.from_env()
    dockerfile = (
        f'FROM {BUSYBOX}\nLABEL agentcompass.test-nonce="{nonce}"\nWORKDIR /home/app\nENV GREETING=hi\nCMD ["sh"]\n'
    )
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    base_id = client.images.get(tag).id
    try:
        yield tag
    finally:
        for image in client.images.list(filters={"label": f"agentcompass.base-image={base_id}"}):
            client.images.remove(image.id, force=True)
        client.images.remove(tag, force=True)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """A cache set: a tarball holding an executable 'agent', and a note."""
    folder = tmp_path / "set"
    folder.mkdir()
    with tarfile.open(folder / "agent.tgz", "w:gz") as archive:
        data = b"#!/bin/sh\necho agent says hi\n"
        entry = tarfile.TarInfo("agent")
        entry.size, entry.mode = len(data), 0o755
        archive.addfile(entry, io.BytesIO(data))
    (folder / "note").write_text("from the cache")
    return folder


def recipe(files: Path, script: str = SCRIPT, timeout: float = 120.0) -> AgentInstall:
    return AgentInstall("fake-agent", "1.0", str(files), "digest-" + uuid.uuid4().hex[:8], script, timeout)


def leftovers(install: AgentInstall) -> tuple[str, str]:
    """Install containers and temporary images of ``install`` still on the engine."""
    selector = ["--filter", f"label=agentcompass.install-key={install.key}", "--filter", "label=agentcompass.purpose"]
    return docker("ps", "-aq", *selector), docker("images", "-aq", *selector)


def run_in(image: str, *command: str) -> str:
    return docker("run", "--rm", "--network", "none", image, *command)


def test_concurrent_sessions_install_once_and_the_image_is_the_base_plus_the_agent(base: str, files: Path) -> None:
    install = recipe(files)
    client = docker_sdk.from_env()

    async def five() -> list[dict[str, Any]]:
        images = AgentImages()
        return list(
            await asyncio.gather(
                *(images.ensure(client, base, install, {"agentcompass.run": "t"}, True, "run") for _ in range(5))
            )
        )

    done = asyncio.run(five())
    assert [d["installed"] for d in done].count(True) == 1
    (tag,) = {d["image"] for d in done}
    made = next(d for d in done if d["installed"])
    assert made["seconds"] > 0 and made["base"] == base
    assert run_in(tag, f"{install.prefix}/bin/agent") == "agent says hi"
    assert run_in(tag, "sh", "-c", "ls /opt/agentcompass") == "agents"  # the packages stayed out
    derived, original = client.images.get(tag).attrs, client.images.get(base).attrs
    for key in ("Cmd", "Entrypoint", "Env", "WorkingDir", "User"):
        assert derived["Config"][key] == original["Config"][key], key
    assert len(derived["RootFS"]["Layers"]) == len(original["RootFS"]["Layers"]) + 1
    labels = derived["Config"]["Labels"]
    assert labels["agentcompass.agent"] == "fake-agent" and labels["agentcompass.base-image"] == original["Id"]
    assert "agentcompass.run" not in labels and "agentcompass.purpose" not in labels
    assert leftovers(install) == ("", "")

    # Another process (a new AgentImages) finds the image made: nothing installs.
    again = asyncio.run(AgentImages().ensure(client, base, install, {}, True, "run"))
    assert again["image"] == tag and again["installed"] is False


def test_without_a_shared_folder_the_files_are_copied_in(base: str, files: Path) -> None:
    install = recipe(files)
    client = docker_sdk.from_env()
    done = asyncio.run(AgentImages().ensure(client, base, install, {}, False, "run"))
    assert done["installed"] is True
    assert run_in(done["image"], f"{install.prefix}/bin/agent") == "agent says hi"
    assert run_in(done["image"], "sh", "-c", "ls /opt/agentcompass") == "agents"
    assert leftovers(install) == ("", "")


def test_a_failed_install_names_its_log_tail_and_is_not_repeated_within_the_run(base: str, files: Path) -> None:
    install = recipe(files, 'echo "unpacking the agent"; echo "no space left for the agent" >&2; exit 7')
    client = docker_sdk.from_env()
    images = AgentImages()
    with pytest.raises(SessionError) as caught:
        asyncio.run(images.ensure(client, base, install, {}, True, "run"))
    message = str(caught.value)
    assert "installing fake-agent 1.0 into image" in message and "exited with 7" in message
    assert "no space left for the agent" in message
    assert leftovers(install) == ("", "")
    created = docker("ps", "-aq", "--filter", "label=agentcompass.purpose=agent-install")
    with pytest.raises(SessionError, match="exited with 7"):  # the same run: the memo answers
        asyncio.run(images.ensure(client, base, install, {}, True, "run"))
    assert docker("ps", "-aq", "--filter", "label=agentcompass.purpose=agent-install") == created


def test_an_install_past_its_timeout_is_stopped(base: str, files: Path) -> None:
    install = recipe(files, "sleep 600", timeout=2)
    with pytest.raises(SessionError, match="timed out after 2s"):
        asyncio.run(AgentImages().ensure(docker_sdk.from_env(), base, install, {}, True, "run"))
    assert leftovers(install) == ("", "")


def test_what_a_killed_install_left_is_removed_by_the_next_one(base: str, files: Path) -> None:
    install = recipe(files)
    labels = {"agentcompass": "1", "agentcompass.purpose": "agent-install", "agentcompass.install-key": install.key}
    client = docker_sdk.from_env()
    stale = client.containers.create(base, ["sleep", "600"], labels=labels)
    asyncio.run(AgentImages().ensure(client, base, install, {}, True, "run"))
    with pytest.raises(docker_sdk.errors.NotFound):
        client.containers.get(stale.id)
    assert leftovers(install) == ("", "")


def test_only_task_sessions_with_a_recipe_get_the_agent(base: str, files: Path) -> None:
    install = recipe(files)
    client = docker_sdk.from_env()

    def config(purpose: Any, params: dict[str, Any]) -> SessionConfig:
        return SessionConfig(purpose=purpose, task_id="t", attempt_index=0, network_policy="disabled", params=params)

    plain = asyncio.run(with_agent(client, base, config("task", {}), "", True, "run"))
    evaluation = asyncio.run(
        with_agent(client, base, config("evaluation", {"agent_install": install.to_params()}), "", True, "run")
    )
    assert plain == (base, None) and evaluation == (base, None)
    image, facts = asyncio.run(
        with_agent(client, base, config("task", {"agent_install": install.to_params()}), "", True, "run")
    )
    assert facts is not None and image == facts["image"] != base
