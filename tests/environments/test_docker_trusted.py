"""What a docker session does without the container's tools, on the real engine: archive I/O,
the engine's view of the container, snapshots, and the limits a container starts with."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest
from test_docker import IMAGE, leftovers

from pytest_agentcompass import EnvironmentSpec
from pytest_agentcompass.environments.conformance import make_plan
from pytest_agentcompass.environments.docker import DockerEnvironment
from pytest_agentcompass.vocabulary.errors import SessionError

T = TypeVar("T")


def scenario(
    params: dict[str, Any],
    body: Callable[[DockerEnvironment, Any, str], Awaitable[T]],
    image: str = IMAGE,
    environment: dict[str, Any] | None = None,
) -> T:
    """Run ``body(provider, session, run_id)`` on a task session of ``image`` (``environment``: the
    plan's per-task params); everything is closed afterwards, and no container of the run is left."""
    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": image, **params}))
    run_id = f"scenario-{uuid.uuid4().hex[:8]}"

    async def go() -> T:
        plan = dataclasses.replace(make_plan(), environment=environment or {})
        try:
            session = await provider.open(provider.build_config(plan, "task", {"agentcompass.run": run_id}))
            try:
                return await body(provider, session, run_id)
            finally:
                await session.close()
                await provider.end_attempt(plan.task_id, plan.attempt_index)
        finally:
            await provider.aclose()

    try:
        return asyncio.run(go())
    finally:
        assert leftovers(f"agentcompass.run={run_id}") == []


async def _sh(session: Any, script: str) -> str:
    done = await session.exec(["sh", "-c", script], user="0")
    assert done.exit_code == 0, done.stderr
    return str(done.stdout)


def test_replace_tree_takes_out_what_was_planted_without_running_the_containers_tools(tmp_path: Path) -> None:
    source = tmp_path / "tests"
    (source / "sub").mkdir(parents=True)
    (source / "test.sh").write_text("echo real\n")
    (source / "test.sh").chmod(0o755)
    (source / "sub" / "data.txt").write_text("d\n")

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        # A planted /tests with a conftest, and a /logs/verifier that is a link elsewhere; and
        # every tool the runner could call replaced by one that fails.
        await _sh(
            session,
            "mkdir -p /tests /elsewhere && echo evil > /tests/conftest.py && mkdir -p /logs && "
            "ln -s /elsewhere /logs/verifier && echo 1 > /elsewhere/reward.txt && "
            "cd /bin && for t in mv cat mkdir chmod rm; do busybox rm -f $t && printf '#!/bin/sh\\nexit 9\\n' > $t "
            "&& busybox chmod 755 $t; done",
        )
        await session.replace_trees([("/tests", source, 0o755), ("/logs/verifier", None, 0o777)])
        await session.make_dirs(["/logs/agent", "/logs/artifacts"])
        listing = await _sh(
            session, "cd /tests && find . | sort; ls -ld /logs/verifier /logs/agent; ls /logs/verifier /elsewhere"
        )
        assert listing.split("\n")[:4] == [".", "./sub", "./sub/data.txt", "./test.sh"]
        assert "drwxrwxrwx" in listing and "->" not in listing  # a folder now, not the link
        assert "reward.txt" in listing.split("/elsewhere:")[-1]  # what the link led to is untouched
        assert (await session.stat("/tests/test.sh"))["mode"] & 0o777 == 0o755
        assert await session.stat("/tests/conftest.py") is None

    scenario({}, body)


def test_a_write_racing_the_emptying_of_a_folder_is_tried_again_then_said() -> None:
    """The engine's removal of a folder fails with "directory not empty" when something writes into it
    meanwhile: the archive goes again (three times in all), and a writer that never stops gets the
    engine's own error. A race that ends (a write the pause did not stop) is over by the next try."""

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        writer = "while :; do mkdir -p /x/a/b; for i in 1 2 3 4 5 6 7 8 9; do echo 1 > /x/a/b/f$i; done; done"
        for _ in range(4):  # four writers, straight through the engine (they stay): each try meets one
            session.container.exec_run(["sh", "-c", writer], detach=True)
        await _sh(session, "while ! test -e /x/a/b/f9; do sleep 0.01; done")
        sent: list[Any] = []
        real = session.container.put_archive
        session.container.put_archive = lambda *args: sent.append(args) or real(*args)  # counts the requests
        for _ in range(5):  # a busy machine may starve the writers for a whole try: a race is what is tested
            sent.clear()
            try:
                await session.replace_trees([("/x", None, 0o777)])
            except Exception as exc:
                assert "directory not empty" in str(exc) and len(sent) == 3, (exc, len(sent))
                return
            assert 1 <= len(sent) <= 3
        pytest.fail("four writers never raced the engine's emptying of /x in five tries")

    scenario({}, body)


def test_a_container_starts_with_the_folders_its_plan_asks_for() -> None:
    """``make_dirs`` (Harbor's log folders): made with the keepalive, before the start, mode 0777;
    asked for again before any command ran, no request; after one ran, made again."""

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        from pytest_agentcompass.environments import docker_trusted

        real, calls = docker_trusted.make_dirs, []

        def counted(*args: Any) -> None:
            calls.append(args[1])
            real(*args)

        docker_trusted.make_dirs = counted  # type: ignore[assignment]
        try:
            await session.make_dirs(["/logs/agent", "/logs/verifier"], 0o777)
            assert calls == []  # there already
            listing = await _sh(session, "ls -ld /logs/agent /logs/verifier && rmdir /logs/agent")
            assert listing.count("drwxrwxrwx") == 2, listing
            await session.make_dirs(["/logs/agent"], 0o777)  # a command ran (and removed it): made again
            assert calls == [["/logs/agent"]]
            assert "drwxrwxrwx" in await _sh(session, "ls -ld /logs/agent")
        finally:
            docker_trusted.make_dirs = real  # type: ignore[assignment]

    scenario({}, body, environment={"make_dirs": ["/logs/agent", "/logs/verifier"]})


def test_an_image_that_refuses_the_folders_still_starts(tmp_path: Path) -> None:
    """A ``/logs`` that is a file in the image: the keepalive goes alone, and the folders are the
    benchmark's to make (and fail) later, as without ``make_dirs``."""
    tag = f"agentcompass-logs-file:{uuid.uuid4().hex[:12]}"
    (tmp_path / "Dockerfile").write_text(f"FROM {IMAGE}\nRUN touch /logs\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], check=True, capture_output=True)

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        assert session.made_dirs == ()
        with pytest.raises(Exception, match="Error processing tar file"):
            await session.make_dirs(["/logs/agent"], 0o777)

    try:
        scenario({}, body, image=tag, environment={"make_dirs": ["/logs/agent"]})
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def test_make_dirs_must_be_absolute_folders() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        raise AssertionError("opened")

    with pytest.raises(SessionError, match="make_dirs must be a list of absolute folders"):
        scenario({}, body, environment={"make_dirs": ["logs"]})


def test_reads_and_copies_are_bounded_whatever_the_file() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        await _sh(
            session,
            "mkdir -p /logs/out && cd /logs/out && printf abc > a.txt && truncate -s 3G sparse.bin && "
            "printf zz > z.txt && mkfifo pipe && ln -s /etc/passwd link && mkdir deep && echo x > deep/d.txt",
        )
        head, size = await session.read_head("/logs/out/sparse.bin", 16)
        assert (head, size) == (b"\0" * 16, 3 * 1024**3)
        assert await session.read_bytes("/logs/out/a.txt") == b"abc"
        kept: dict[str, bytes] = {}

        def save(name: str, handle: IO[bytes], size: int) -> int:
            kept[name] = handle.read(size)
            return size

        report = await session.copy_out("/logs/out", save, 1024, 30.0, skip=lambda name: name.startswith("deep/"))
        # The pipe and the link are never read or followed; the sparse file is cut, not streamed.
        assert set(kept) <= {"a.txt", "z.txt"}
        # Reading through 3 GB of zeros would cost more than the cap: the copy stops there.
        assert report.stopped.startswith("stopped at sparse.bin (3221225472 bytes)"), report
        assert {c["name"] for c in report.cut} == {"sparse.bin"} and report.read_bytes < 2 * 1024**2
        assert "deep/d.txt" not in kept and "pipe" not in kept and "link" not in kept
        single = await session.copy_out("/logs/out/a.txt", save, 1024)
        assert single.files == 1 and kept["a.txt"] == b"abc"  # one file copies under its own name
        late = await session.copy_out("/logs/out", save, 1024, time_limit=1e-6)
        assert late.stopped.startswith("stopped after")
        with pytest.raises(SessionError, match="is not a file"):
            await session.read_head("/logs/out/deep", 10)

    scenario({}, body)


def test_a_copy_says_what_its_watched_entries_are_in_the_same_request() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        await _sh(
            session,
            "mkdir -p /logs/w && cd /logs/w && truncate -s 5000 a.bin && printf 0.5 > reward.txt && "
            "ln -s /etc/hostname reward.json && head -c 3000 /dev/urandom > big.txt && ln big.txt hard.txt && "
            "mkdir sub && echo 1 > sub/reward.txt && ln -s /logs/w /logs/link",
        )
        kept: dict[str, bytes] = {}

        def save(name: str, handle: IO[bytes], size: int) -> int:
            kept[name] = handle.read(size)
            return size

        names = ("", "reward.txt", "reward.json", "big.txt", "hard.txt", "absent.txt")
        report = await session.copy_out("/logs/w", save, 100_000, 30.0, watch=(names, 1000))
        big = await session.read_bytes("/logs/w/big.txt")
        # A link is said, not followed; a second name of a file earlier in the archive is left unsaid.
        assert report.watched == {
            "": "a folder",
            "reward.txt": (b"0.5", 3),
            "reward.json": "a link to /etc/hostname",
            "big.txt": (big[:1000], 3000),
            "hard.txt": None,
        }
        # Read for the watch first, a file is still copied whole, the part past the watch's limit included.
        assert kept["big.txt"] == big and kept["reward.txt"] == b"0.5" and kept["sub/reward.txt"] == b"1\n"
        assert len(kept["a.bin"]) == 5000 and report.cut == [] and report.files == 4
        # The copy stops at a file it cannot afford to read through: what came after it is not watched.
        stopped = await session.copy_out("/logs/w", save, 1000, 30.0, watch=(names, 1000))
        assert stopped.stopped.startswith("stopped at a.bin") and stopped.watched == {"": "a folder"}
        # A folder replaced by a link: the archive holds the link alone.
        linked = await session.copy_out("/logs/link", save, 1000, 30.0, watch=(names, 1000))
        assert linked.watched == {"": "a link to /logs/w"} and linked.files == 0

    scenario({}, body)


def test_changes_and_processes_come_from_the_engine() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        await _sh(session, "echo x > /made.txt && rm -f /bin/true; ( setsid sleep 300 </dev/null >/dev/null 2>&1 & )")
        found = {(c.kind, c.path) for c in await session.changes()}
        assert ("added", "/made.txt") in found and ("deleted", "/bin/true") in found
        assert not any("docker-init" in path for _, path in found)  # the engine's own mount
        assert any(p.args == "sleep 300" for p in await session.processes())
        # A replaced `ps` changes nothing: the host lists the processes.
        await _sh(session, "rm /bin/ps && printf '#!/bin/sh\\nexit 0\\n' > /bin/ps && chmod 755 /bin/ps")
        assert any(p.args == "sleep 300" for p in await session.processes())
        await session.freeze()
        assert await session.processes() == []
        assert "PATH=" in " ".join(await session.environ())

    scenario({}, body)


def test_a_snapshot_is_verified_from_and_removed_with_its_attempt() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> str:
        await _sh(session, "echo agent-work > /work/answer.txt; ( setsid sleep 300 </dev/null >/dev/null 2>&1 & )")
        image = await session.snapshot()
        assert await session.processes() == []  # frozen: nothing of the agent runs on
        plan = dataclasses.replace(make_plan(mode="fresh"), environment={"evaluation": {"from_snapshot": True}})
        labels = {"agentcompass.run": run_id}
        evaluation = await provider.open(provider.build_config(plan, "evaluation", labels))
        try:
            assert (await _sh(evaluation, "cat /work/answer.txt")).strip() == "agent-work"
            assert not any("sleep 300" in p.args for p in await evaluation.processes())
        finally:
            await evaluation.close()
        assert _images(run_id) == [image.split(":")[1][:12]]  # kept for a retried evaluation
        await provider.end_attempt(plan.task_id, plan.attempt_index)
        assert _images(run_id) == []
        # Opened again without a snapshot: one clear error, not the task's image.
        with pytest.raises(SessionError, match="none was taken"):
            await provider.open(provider.build_config(plan, "evaluation", labels))
        return image

    scenario({}, body)


def test_the_sweep_removes_a_killed_runs_snapshots() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        await session.snapshot()
        provider.snapshots = type(provider.snapshots)()  # forgotten, as by a process that died
        assert len(_images(run_id)) == 1
        assert await provider.sweep(run_id) >= 1
        assert _images(run_id) == []

    scenario({}, body)


def test_a_container_too_large_to_snapshot_is_refused() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        await _sh(session, "truncate -s 2G /work/sparse.bin")
        with pytest.raises(Exception, match=r"holds 2\.0 GB of changes.*more than a snapshot may hold \(1 MB"):
            await session.snapshot()
        assert _images(run_id) == []

    scenario({"snapshot_limit_mb": 1}, body)


@pytest.mark.parametrize(("params", "expected"), [({}, 1024), ({"pids_limit": 64}, 64), ({"pids_limit": 0}, 0)])
def test_pids_are_limited_by_default(params: dict[str, Any], expected: int) -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        inspected = json.loads(subprocess.run(["docker", "inspect", session.container.id], capture_output=True).stdout)
        assert (inspected[0]["HostConfig"]["PidsLimit"] or 0) == expected

    scenario(params, body)


def test_storage_is_applied_where_the_engine_can_and_said_once_where_it_cannot() -> None:
    driver = subprocess.run(["docker", "info", "-f", "{{json .DriverStatus}}"], capture_output=True, text=True)
    if '"xfs"' in driver.stdout:
        pytest.skip("this engine's storage may take a quota: the refusal cannot be shown here")

    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        plan = dataclasses.replace(make_plan(), environment={"storage_mb": 512})
        labels = {"agentcompass.run": run_id}
        for _ in range(2):
            opened = await provider.open(provider.build_config(plan, "task", labels))
            await opened.close()
        notes = [n for n in provider.notes if n.startswith("storage_mb")]
        assert len(notes) == 1 and "storage-opt" in notes[0] and "storage_limits: require" in notes[0]
        strict = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE, "storage_limits": "require"}))
        strict._no_storage = dict(provider._no_storage)  # the engine already said so
        with pytest.raises(SessionError, match=r"disk quota \(storage_mb=512\).*storage_limits: require"):
            await strict.open(strict.build_config(plan, "task", labels))

    scenario({}, body)


def _images(run_id: str) -> list[str]:
    out = subprocess.run(
        ["docker", "images", "-q", "--no-trunc", "--filter", f"label=agentcompass.run={run_id}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split(":")[-1][:12] for line in out.split()]


def test_staging_under_a_racing_writer_is_done_with_its_processes_suspended() -> None:
    async def body(provider: DockerEnvironment, session: Any, run_id: str) -> None:
        # A writer that keeps recreating what the runner empties (removing a folder under it fails).
        await _sh(
            session,
            "( setsid sh -c 'while :; do mkdir -p /logs/verifier/d; echo 1 > /logs/verifier/d/r; done' "
            "</dev/null >/dev/null 2>&1 & )",
        )
        for _ in range(10):
            async with session.paused():
                await session.replace_tree("/logs/verifier", None, 0o777)
                assert await session.stat("/logs/verifier/d") is None  # empty, and stays so while paused
        # Resumed afterwards: shared mode keeps what the agent left running.
        assert any(not p.stopped and "while :" in p.args for p in await session.processes())

    scenario({}, body)
