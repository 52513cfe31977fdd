"""The docker provider's pool of engines, against real extra engines (see ``tests/suites/engines.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import IMAGE, Engines, SshLoopback, TcpProxy, Unavailable, make_certificates, server_context

from pytest_agentcompass import BaseEnvironment, EnvironmentSpec
from pytest_agentcompass.environments.base import SessionConfig
from pytest_agentcompass.environments.conformance import EnvironmentConformance
from pytest_agentcompass.environments.docker import DockerEnvironment
from pytest_agentcompass.vocabulary.errors import SessionError

from conftest import SUITES, write_config

BENCH = f"{SUITES / 'pool_tasks.py'}:PoolTasks"
NO_NETWORK = {"baseline": "disabled", "run": "disabled", "evaluation": "disabled"}


def main_engine_ready() -> bool:
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.fixture(scope="session")
def engines() -> Iterator[Engines]:
    """Two extra engines, started once per test process and removed with their data."""
    if not main_engine_ready():
        pytest.skip("no Docker engine with the test image to copy it from (run scripts/start-docker.sh)")
    try:
        pool = Engines(2)
    except Unavailable as exc:
        pytest.skip(f"extra Docker engines cannot run here: {exc}")
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(autouse=True)
def _no_leftovers(request: pytest.FixtureRequest) -> None:
    """Each test starts with no container on the shared extra engines: a test that failed may have
    left some (its own assertions say so), and the next tests count every container there."""
    if "engines" not in request.fixturenames:
        return
    pool = request.getfixturevalue("engines")
    if not isinstance(pool, Engines):  # a test's own parameter of that name
        return
    for engine in pool.engines:
        left = engine.docker("ps", "-aq", "--filter", "label=agentcompass", check=False).stdout.split()
        if left:
            engine.docker("rm", "-f", *left, check=False)


def pool_request(pool: list[Any], /, *, n: int = 4, retries: int = 0, **bench: Any) -> dict[str, Any]:
    return {
        "name": "p",
        "benchmark": {"id": BENCH, "params": {"n": n, **bench}},
        "environment": {
            "id": "docker",
            "network": NO_NETWORK,
            "params": {"image": IMAGE, "engines": pool, "probe_interval": 0.5},
        },
        "execution": {"max_retries": retries, "retry_backoff_seconds": 0},
    }


def details(pytester: pytest.Pytester) -> dict[str, dict[str, Any]]:
    (run_dir,) = [p for p in (pytester.path / "runs/p").iterdir() if not p.name.startswith(".")]
    return {p.stem: json.loads(p.read_text()) for p in (run_dir / "details").glob("*.json")}


def held_at_once(events: Path) -> dict[str, int]:
    """The most sessions each engine held at once, from the tasks' start/end records."""
    now: dict[str, int] = {}
    peak: dict[str, int] = {}
    for line in events.read_text().splitlines():
        event = json.loads(line)
        now[event["engine"]] = now.get(event["engine"], 0) + (1 if event["event"] == "start" else -1)
        peak[event["engine"]] = max(peak.get(event["engine"], 0), now[event["engine"]])
    return peak


def run_pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *args)


@pytest.mark.parametrize(
    ("engines", "message"),
    [
        ("[]", "engines: Value error, engines takes a non-empty list"),
        ('["http//nowhere"]', "engines[0].url: Value error, 'http//nowhere' is not an engine URL"),
        ('["unix:///a.sock", "unix:///a.sock"]', "engines: Value error, engine 'unix:///a.sock' is listed twice"),
        ("[{url: 'unix:///a.sock', capacity: -1}]", "engines[0].capacity: Input should be greater than or equal to 0"),
        ("[{url: 'unix:///a.sock', tls: {verify: true}}]", "engines[0]: Value error, tls applies to tcp:// engines"),
        ("[{url: 'tcp://h:2376', tls: {ca_cert: ca.pem}}]", "engines[0].tls: Value error, ca_cert: no file at"),
        ("[{url: 'tcp://h:2376', tls: {client_cert: c.pem}}]", "engines[0].tls: Value error, client_cert and"),
        ("[{url: 'tcp://h:2376', port: 1}]", "engines[0].port: unknown key"),
    ],
)
def test_engine_params_are_checked_with_file_and_line(pytester: pytest.Pytester, engines: str, message: str) -> None:
    (pytester.path / "agentcompass.yaml").write_text(
        textwrap.dedent(
            f"""
            requests:
              - name: r
                benchmark: {{id: "{BENCH}"}}
                environment:
                  id: docker
                  params: {{engines: {engines}}}
            """
        ).lstrip()
    )
    result = pytester.runpytest("--agentcompass=agentcompass.yaml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    where = "agentcompass.yaml:6: requests[[]0[]].environment.params."
    result.stdout.fnmatch_lines([f"*{where}{message.replace('[', '[[]')}*"])
    result.stdout.no_fnmatch_line("*Traceback*")


def test_tasks_spread_over_engines_within_each_capacity(pytester: pytest.Pytester, engines: Engines) -> None:
    a, b = engines.engines
    proxy = TcpProxy(str(a.root / "docker.sock"))  # engine A reached over tcp://
    try:
        events = pytester.path / "events.jsonl"
        pool = [{"url": proxy.url, "capacity": 2}, {"url": b.url, "capacity": 2}]
        write_config(pytester, [pool_request(pool, n=8, sleep={"*": 1}, events=str(events))], task_concurrency=8)
        result = run_pytest(pytester)
    finally:
        proxy.close()
    result.assert_outcomes(passed=8)
    placed = {task: detail["metadata"]["placement"]["task"] for task, detail in details(pytester).items()}
    assert sorted(placed.values()) == sorted([proxy.url] * 4 + [b.url] * 4)
    assert held_at_once(events) == {proxy.url: 2, b.url: 2}
    # The plans record the engine too (learned when the attempt's container opened).
    (run_dir,) = [p for p in (pytester.path / "runs/p").iterdir() if not p.name.startswith(".")]
    plans = json.loads((run_dir / "run_info.json").read_text())["resolved_execution_plans"]
    assert {task: attempts["0"]["placement"]["task"] for task, attempts in plans.items()} == placed
    assert a.containers() == [] and b.containers() == []


def test_a_tls_engine_with_client_certificates(
    pytester: pytest.Pytester, engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tcp://`` with ``tls`` files against a TLS endpoint that checks both sides, as ``--tlsverify`` does."""
    a, b = engines.engines
    certs = make_certificates(pytester.path / "certs")
    # As on many CI machines: a CA bundle for requests in the environment, which
    # must not replace the engine's own CA (it did: every call failed).
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certs["client_cert"]))
    proxies = [TcpProxy(str(a.root / "docker.sock"), tls=server_context(certs)) for _ in range(3)]
    try:
        ca, cert, key = (str(certs[k]) for k in ("ca", "client_cert", "client_key"))
        good = {"url": proxies[0].url, "tls": {"ca_cert": ca, "client_cert": cert, "client_key": key}}
        write_config(pytester, [pool_request([good], n=3)], task_concurrency=3)
        result = run_pytest(pytester)
        result.assert_outcomes(passed=3)
        assert {d["metadata"]["placement"]["task"] for d in details(pytester).values()} == {proxies[0].url}
        assert proxies[0].refused == []

        # No client certificate (the engine refuses the handshake) and a CA that did
        # not sign the engine's certificate: each one clear preflight line, and the
        # run goes on with the engine that answers.
        shutil.rmtree(pytester.path / "runs")
        no_cert = {"url": proxies[1].url, "tls": {"ca_cert": ca}}
        wrong_ca = {"url": proxies[2].url, "tls": {"ca_cert": cert, "client_cert": cert, "client_key": key}}
        write_config(pytester, [pool_request([no_cert, wrong_ca, b.url], n=2)], task_concurrency=2)
        result = run_pytest(pytester)
        result.assert_outcomes(passed=2)
        for proxy in proxies[1:]:
            lines = [line for line in result.outlines if proxy.url in line]
            assert len(lines) == 1 and "left out" in lines[0], result.outlines
            assert proxy.refused, "the handshake failed"
        (wrong,) = [line for line in result.outlines if proxies[2].url in line]
        assert "certificate verify failed" in wrong, wrong
        assert "Traceback" not in result.stdout.str()

        # verify: false stays off (requests turned it back on against the bundle).
        shutil.rmtree(pytester.path / "runs")
        unverified = {"url": proxies[1].url, "tls": {"verify": False, "client_cert": cert, "client_key": key}}
        write_config(pytester, [pool_request([unverified], n=1)])
        run_pytest(pytester).assert_outcomes(passed=1)

        # The environment's engine, the Docker CLI's way: DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH.
        shutil.rmtree(pytester.path / "runs")
        cert_path = pytester.path / "docker-certs"
        cert_path.mkdir()
        for source, name in (("ca", "ca.pem"), ("client_cert", "cert.pem"), ("client_key", "key.pem")):
            shutil.copy(certs[source], cert_path / name)
        monkeypatch.setenv("DOCKER_HOST", proxies[0].url)
        monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
        monkeypatch.setenv("DOCKER_CERT_PATH", str(cert_path))
        request = pool_request([], n=1)
        del request["environment"]["params"]["engines"]
        write_config(pytester, [request])
        run_pytest(pytester).assert_outcomes(passed=1)
    finally:
        for proxy in proxies:
            proxy.close()
    assert a.containers() == [] and b.containers() == []


def test_engine_capacity_is_run_wide_under_xdist(pytester: pytest.Pytester, engines: Engines) -> None:
    a, b = engines.engines
    events = pytester.path / "events.jsonl"
    pool = [{"url": a.url, "capacity": 1}, {"url": b.url, "capacity": 1}]
    write_config(pytester, [pool_request(pool, n=6, sleep={"*": 1}, events=str(events))], task_concurrency=6)
    result = run_pytest(pytester, "-n", "2")
    result.assert_outcomes(passed=6)
    # Each worker places its tasks itself; the engines' slots are counted by the controller.
    assert held_at_once(events) == {a.url: 1, b.url: 1}
    assert a.containers() == [] and b.containers() == []


def test_fresh_evaluation_runs_on_its_tasks_engine(pytester: pytest.Pytester, engines: Engines) -> None:
    urls = [e.url for e in engines.engines]
    write_config(pytester, [pool_request(urls, n=4, mode="fresh")], task_concurrency=4)
    result = run_pytest(pytester)
    result.assert_outcomes(passed=4)
    placements = [d["metadata"]["placement"] for d in details(pytester).values()]
    assert all(p["evaluation"] == p["task"] for p in placements), placements
    assert {p["task"] for p in placements} == set(urls)


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["in-process", "xdist"])
def test_an_engine_that_dies_mid_run_fails_over(
    pytester: pytest.Pytester, engines: Engines, xdist: tuple[str, ...]
) -> None:
    a, b = engines.engines
    started = pytester.path / "started"
    started.mkdir()
    request = pool_request(
        [{"url": a.url, "capacity": 1}, {"url": b.url, "capacity": 1}],
        # Under xdist each worker places by its own load: two tasks each, so one lands on B.
        n=4 if xdist else 2,
        retries=1,
        sleep={b.url: 300},  # what runs on B runs until B dies
        started=str(started),
        engines=[a.url, b.url],
    )
    write_config(pytester, [request], task_concurrency=4 if xdist else 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *xdist],
        cwd=pytester.path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        while not list(started.glob("*@1")):
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
        (on_b,) = [p.name.split("@")[0] for p in started.glob("*@1")]
        b.kill()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if b.proc is None:
            b.start()  # the next tests need it (a restarted engine stops what the dead one left)
    assert proc.returncode == 0, out
    # Under xdist a worker saw it happen; the controller's summary says it all the same.
    assert len([line for line in out.splitlines() if "stopped answering during the run" in line]) == 1, out
    detail = details(pytester)[on_b]
    assert detail["retries"] == 1 and detail["metadata"]["placement"] == {"task": a.url}
    (retry,) = (pytester.path / "runs/p").glob(f"*/retry_details/{on_b}/attempt-0-retry-1.json")
    failed = json.loads(retry.read_text())
    assert failed["placement"] == {"task": b.url} and failed["error_kind"] == "environment"
    assert f"the Docker engine {b.url} stopped answering" in failed["error"]
    assert a.containers() == []
    b.docker("container", "prune", "-f")  # what the dead engine could not remove (it was killed)


def test_a_dead_engine_takes_work_again_once_it_answers(engines: Engines) -> None:
    a, b = engines.engines
    mark = uuid.uuid4().hex
    provider = DockerEnvironment(
        EnvironmentSpec(
            id="docker", params={"image": IMAGE, "engines": [a.url, b.url], "probe_interval": 0.01, "workdir": None}
        )
    )
    config = SessionConfig("task", "t", 0, "disabled", {**provider.spec.params, "network_never": True}, {"m": mark})

    async def scenario() -> None:
        await provider.preflight()
        first = await provider.open(config)
        await first.close()
        assert first.placement == a.url  # the first engine when both are idle
        on_b = await provider.open(dataclasses_replace(config, placement=b.url))
        assert on_b.placement == b.url
        b.kill()
        with pytest.raises(SessionError, match=f"the Docker engine {b.url} stopped answering"):
            await on_b.exec(["true"])
        await on_b.close()  # the engine is gone: its container is removed once it answers again
        assert provider.pool.engines[1].orphans == [on_b.container.id]
        assert (await _open_close(provider, dataclasses_replace(config, placement=b.url))) == a.url
        # It comes back on fresh storage: without the test image (copied from A again), and without
        # the keepalive's volume (a container mounting it by name would get an empty one).
        lost = list((b.root / "data" / "volumes").glob("agentcompass-keepalive-*"))
        assert lost, "no keepalive volume where dockerd keeps volumes: the loss below would not happen"
        b.lose_storage()
        b.start()  # from this thread, which outlives the engine (it dies with the thread that starts it)
        deadline = time.monotonic() + 60
        while (back := await provider.open(dataclasses_replace(config, placement=b.url))).placement != b.url:
            await back.close()
            assert time.monotonic() < deadline, f"{b.url} did not take work again within 60 s"
            await asyncio.sleep(0.02)  # the next probe (every 10 ms here) finds it answering
        try:
            done = await back.exec(["echo", "up"])  # its keepalive runs: from a volume made since
            assert (done.exit_code, done.stdout) == (0, "up\n"), done
        finally:
            await back.close()
        assert provider.pool.engines[1].orphans == []

    async def closed() -> None:
        try:
            await scenario()
        finally:
            await provider.aclose()  # the keepalive volumes and holders too, whatever failed

    holders = {e.url: e.containers("agentcompass.keepalive") for e in (a, b)}
    try:
        asyncio.run(closed())
    finally:
        if b.proc is None:
            b.start()
    assert a.containers(f"m={mark}") == [] and b.containers(f"m={mark}") == []
    for engine in (a, b):  # the keepalive volumes: the lost one's holder, and the one made since
        left = engine.containers("agentcompass.keepalive")
        volumes = engine.docker("volume", "ls", "-q", "--filter", f"label=m={mark}").stdout.split()
        assert (set(left) - set(holders[engine.url]), volumes) == (set(), [])


def test_an_engine_that_dies_right_after_its_preflight_ping_is_left_out(engines: Engines) -> None:
    """An engine that answered the ping and died before its image was looked for (a race CI met
    under xdist: another worker's task made the test kill it) is left out, not the whole request."""
    from pytest_agentcompass.environments import docker_pool

    a, b = engines.engines
    provider = DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE, "engines": [a.url, b.url]}))
    real = docker_pool.has_image
    on_b = provider.pool.engines[1]

    def dies_first(client: Any, image: str) -> bool:
        if client is on_b.client():
            b.kill()  # the real engine goes away between the ping and this call
        return real(client, image)

    docker_pool.has_image = dies_first  # type: ignore[assignment]
    try:
        asyncio.run(provider.preflight())
        notes = list(provider.notes)
        asyncio.run(provider.aclose())
    finally:
        docker_pool.has_image = real
        if b.proc is None:
            b.start()
    assert len(notes) == 1 and b.url in notes[0] and "left out: not reachable" in notes[0], notes


async def _open_close(provider: DockerEnvironment, config: SessionConfig) -> str | None:
    session = await provider.open(config)
    await session.close()
    return session.placement


def dataclasses_replace(config: SessionConfig, **changes: Any) -> SessionConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["in-process", "xdist"])
def test_an_engine_down_at_preflight_is_left_out_once(
    pytester: pytest.Pytester, engines: Engines, xdist: tuple[str, ...]
) -> None:
    a = engines.engines[0]
    gone = f"unix://{pytester.path}/gone.sock"
    write_config(pytester, [pool_request([gone, a.url], n=4)], task_concurrency=4)
    result = run_pytest(pytester, *xdist)
    result.assert_outcomes(passed=4)  # no attempt spent on it (max_retries is 0), in workers either
    lines = [line for line in result.outlines if "gone.sock" in line]
    assert len(lines) == 1 and "left out: not reachable" in lines[0], lines


def test_no_engine_answering_is_one_preflight_error(pytester: pytest.Pytester) -> None:
    gone = [f"unix://{pytester.path}/gone{i}.sock" for i in range(2)]
    write_config(pytester, [pool_request(gone, n=2)])
    result = run_pytest(pytester)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*request 'p': no Docker engine of the pool is usable (unix://*gone0.sock: not*"])
    assert "Traceback" not in result.stdout.str()


def test_an_image_one_engine_lacks_is_copied_there_once(pytester: pytest.Pytester, engines: Engines) -> None:
    a, b = engines.engines
    tag = f"agentcompass-pool-copy:{uuid.uuid4().hex[:8]}"
    a.docker("tag", IMAGE, tag)
    try:
        request = pool_request([a.url, b.url], n=4)
        request["environment"]["params"]["image"] = tag
        write_config(pytester, [request], task_concurrency=4)
        result = run_pytest(pytester)
        result.assert_outcomes(passed=4)
        assert b.docker("image", "inspect", tag, check=False).returncode == 0
        assert {d["metadata"]["placement"]["task"] for d in details(pytester).values()} == {a.url, b.url}
    finally:
        for engine in (a, b):
            engine.docker("rmi", tag, check=False)


def test_a_resumed_run_sweeps_every_engine(pytester: pytest.Pytester, engines: Engines) -> None:
    a, b = engines.engines
    started = pytester.path / "started"
    started.mkdir()
    request = pool_request([a.url, b.url], n=2, sleep={"*": 300}, started=str(started), engines=[a.url, b.url])
    write_config(pytester, [request], task_concurrency=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        while len(list(started.iterdir())) < 2:
            assert proc.poll() is None
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    assert len(a.containers()) == 1 and len(b.containers()) == 1  # left behind by the killed run
    (pytester.path / "agentcompass.yaml").write_text(
        (pytester.path / "agentcompass.yaml").read_text().replace("'*': 300", "'*': 0")
    )
    result = run_pytest(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*removed 2 environment(s) or process(es) left behind by run*"])
    assert a.containers() == [] and b.containers() == []


def test_an_ssh_engine_takes_sessions(pytester: pytest.Pytester, engines: Engines, tmp_path: Path) -> None:
    pytest.importorskip("paramiko", reason="ssh:// engines need paramiko (pip install 'docker[ssh]')")
    a, b = engines.engines
    try:
        ssh = SshLoopback(tmp_path, a.url)  # engine A, reached as a remote engine over SSH
    except Unavailable as exc:
        pytest.skip(f"no sshd on loopback: {exc}")
    try:
        write_config(pytester, [pool_request([ssh.url, b.url], n=4, sleep={"*": 1})], task_concurrency=4)
        env = {**os.environ, "HOME": str(ssh.home), "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider"],
            cwd=pytester.path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        ssh.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {d["metadata"]["placement"]["task"] for d in details(pytester).values()} == {ssh.url, b.url}
    assert a.containers() == [] and b.containers() == []


def test_kept_containers_give_their_engine_slot_back(pytester: pytest.Pytester, engines: Engines) -> None:
    a = engines.engines[0]
    request = pool_request([{"url": a.url, "capacity": 1}], n=3)
    request["execution"]["keep_environment"] = True
    write_config(pytester, [request], task_concurrency=3)
    try:
        result = pytester.runpytest_subprocess(
            "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", timeout=300
        )
        result.assert_outcomes(passed=3)  # a kept container does not hold its slot past its attempt
        assert len(a.containers()) == 3
    finally:
        for container in a.containers():
            a.docker("rm", "-f", container)


class TestPooledSessionOverTcp(EnvironmentConformance):
    """The provider contract through the pool, on the main engine reached over ``tcp://``: a remote
    engine to the pool, so a timed-out command is killed from inside its container only."""

    @pytest.fixture(autouse=True)
    def _proxy(self) -> Iterator[None]:
        if not main_engine_ready():
            pytest.skip("no Docker engine with the test image (run scripts/start-docker.sh)")
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        if not host.startswith("unix://"):
            pytest.skip(f"the main engine is not on a Unix socket here ({host})")
        self.proxy = TcpProxy(host.removeprefix("unix://"))
        yield
        self.proxy.close()

    def make_provider(self, tmp_path: Path) -> BaseEnvironment:
        self.mark = uuid.uuid4().hex
        return DockerEnvironment(EnvironmentSpec(id="docker", params={"image": IMAGE, "engines": [self.proxy.url]}))

    def labels(self) -> dict[str, str]:
        return {"agentcompass.conformance": self.mark}

    def leaked(self, provider: BaseEnvironment, tmp_path: Path) -> list[Any]:
        found = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=agentcompass.conformance={self.mark}"],
            capture_output=True,
            text=True,
            check=True,
        )
        return found.stdout.split()


def test_task_images_build_on_each_engine_from_bases_copied_there(pytester: pytest.Pytester, engines: Engines) -> None:
    a, b = engines.engines
    base = f"agentcompass-pool-base:{uuid.uuid4().hex[:8]}"  # only engine A has it, as a local base image
    a.docker("tag", IMAGE, base)
    context = pytester.path / "context"
    context.mkdir()
    (context / "hello").write_text("hi\n")
    # No RUN: the extra engines have no bridge network to run build steps on.
    (context / "Dockerfile").write_text(f"FROM {base}\nCOPY hello /hello\n")
    request = pool_request([a.url, b.url], n=4, sleep={"*": 1}, build=str(context))
    del request["environment"]["params"]["image"]
    write_config(pytester, [request], task_concurrency=4)
    try:
        result = run_pytest(pytester)
        result.assert_outcomes(passed=4)
        assert {d["metadata"]["placement"]["task"] for d in details(pytester).values()} == {a.url, b.url}
        tags = {e.url: e.docker("images", "--format", "{{.Tag}}", "agentcompass-task").stdout.split() for e in (a, b)}
        assert len(tags[a.url]) == 1 and tags[a.url] == tags[b.url]  # the same context digest, built on each
    finally:
        for engine in (a, b):
            for image in engine.docker("images", "-q", "agentcompass-task").stdout.split():
                engine.docker("rmi", "-f", image, check=False)
            engine.docker("rmi", base, check=False)
