"""The ``harbor`` benchmark with ``oracle``, ``nop`` and ``command`` on the real Docker engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harbor_tasks import (
    BUSYBOX,
    BUSYBOX_DOCKERFILE,
    containers_of,
    details,
    harbor_request,
    remove_images,
    require_images,
    run_dir,
    write_task,
)
from store_writes import not_through_the_store, writes_under

from conftest import write_config

#: Run as the agent: gives an image without bash the small shim the verifier needs.
SHIM = "printf '#!/bin/sh\\nexec /bin/sh \"$@\"\\n' > /bin/bash && chmod 755 /bin/bash"
EXAMPLE = Path(__file__).parents[2] / "example_suites" / "terminal" / "tasks"


require_images(BUSYBOX)


@pytest.fixture
def own_images(pytester: pytest.Pytester) -> Iterator[list[Path]]:
    """Task dirs whose (unique) images the test builds; removed afterwards so nothing is left.

    The tags come from the build logs' names (the SDK stays out of this process).
    """
    tasks: list[Path] = []
    yield tasks
    logs = pytester.path.glob("runs/*/*/images/*.log")
    remove_images({"agentcompass-task:" + log.stem.rpartition("-")[2] for log in logs})


def outcome(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *args)


def test_same_outcomes_under_xdist(pytester: pytest.Pytester) -> None:
    shutil.copytree(EXAMPLE, pytester.path / "tasks")
    write_config(pytester, [harbor_request("oracle", "tasks"), harbor_request("nop", "tasks", harness="nop")])
    result = outcome(pytester, "-n", "2")
    result.assert_outcomes(passed=5, failed=5)
    for name, score in (("oracle", 1.0), ("nop", 0.0)):
        assert {d["score"] for d in details(pytester.path, name).values()} == {score}
        assert containers_of(run_dir(pytester.path, name).name) == []


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process-loop", "xdist"])
def test_image_built_once_per_run_and_not_again(
    pytester: pytest.Pytester, own_images: list[Path], workers: list[str]
) -> None:
    tasks = pytester.path / "tasks"
    first = write_task(tasks, "one", unique=True)
    for name in ("two", "three"):
        shutil.copytree(first, tasks / name)  # the same context: the same image
    own_images.append(first)
    write_config(pytester, [harbor_request("cached", "tasks", execution={"attempts": {"k": 2}})])
    outcome(pytester, *workers).assert_outcomes(passed=3)
    logs = list((run_dir(pytester.path, "cached") / "images").glob("*.log"))
    assert len(logs) == 1  # six attempts (in two processes under xdist), one build
    assert logs[0].read_text().count("Successfully built") == 1
    result = outcome(pytester, *workers)
    result.assert_outcomes(passed=3)
    assert not list((run_dir(pytester.path, "cached") / "images").glob("*.log"))  # nothing built this time


def test_two_requests_under_xdist_build_a_shared_image_once(pytester: pytest.Pytester, own_images: list[Path]) -> None:
    # Each request has its own run directory: the workers must still take turns per image.
    tasks = pytester.path / "tasks"
    first = write_task(tasks, "one", unique=True)
    shutil.copytree(first, tasks / "two")
    own_images.append(first)
    write_config(pytester, [harbor_request("oracle", "tasks"), harbor_request("nop", "tasks", harness="nop")])
    outcome(pytester, "-n", "2").assert_outcomes(passed=4)  # this task's verifier passes whatever the agent does
    logs = list(pytester.path.glob("runs/*/*/images/*.log"))
    assert len(logs) == 1 and logs[0].read_text().count("Successfully built") == 1, logs


def test_failed_build_is_a_setup_error_of_its_tasks(pytester: pytest.Pytester, own_images: list[Path]) -> None:
    tasks = pytester.path / "tasks"
    broken = BUSYBOX_DOCKERFILE + "RUN echo build-went-wrong-here && exit 3\n"
    own_images.append(write_task(tasks, "bad", dockerfile=broken, unique=True))
    write_task(tasks, "good")
    write_config(pytester, [harbor_request("builds", "tasks")])
    result = outcome(pytester)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at setup of builds::bad*", "*building the image of*failed*", "*build-went-wrong-here*"]
    )
    error = details(pytester.path, "builds")["bad"]["error"]
    assert "build log:" in error and "images" in error


def test_build_timeout_stops_the_build(
    pytester: pytest.Pytester, own_images: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = pytester.path / "tasks"
    # Unique, so no layer cached by an earlier run can stand in for the slow step.
    marker = uuid.uuid4().hex
    # The last echo prints "finished-42-...", which the step's own text in the log does not hold.
    slow = BUSYBOX_DOCKERFILE + f"RUN echo started-{marker} && sleep 90 && echo finished-$((6*7))-{marker}\n"
    own_images.append(write_task(tasks, "slow", dockerfile=slow, build_timeout=2, unique=True))
    write_config(pytester, [harbor_request("slow", "tasks")])
    scratch = pytester.path / "tmp"  # where the build context's tar file is written
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    result = outcome(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at setup of slow::slow*", "*timed out after 2s*build_timeout_sec*the build was stopped*"]
    )
    error = details(pytester.path, "slow")["slow"]["error"]
    log = next((run_dir(pytester.path, "slow") / "images").glob("*.log")).read_text()
    # The error ends with the log's tail (how far the build got before the timeout depends on the load).
    assert error.rstrip().endswith(log.rstrip().rpartition("\n")[2])
    # Stopped, not waited for: the step never got to its end, in the log or in the engine.
    assert f"finished-42-{marker}" not in log
    running = subprocess.run(
        ["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"], capture_output=True, text=True
    ).stdout
    assert [line for line in running.splitlines() if marker in line] == []
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize(
    ("test", "message"),
    [
        ("echo checked >&2; exit 7", "*neither /logs/verifier/reward.txt nor*exit code 7*\nchecked"),
        (": > /logs/verifier/reward.txt", "*reward.txt is empty*"),
        ("echo passed > /logs/verifier/reward.txt", "*reward.txt holds 'passed', not a number*"),
        ("echo '[1]' > /logs/verifier/reward.json", "*reward.json must hold an object*"),
        ("echo started; sleep 30", "*verifier timed out after 1s*"),
        ("echo 0_1 > /logs/verifier/reward.txt", "*reward.txt holds '0_1', not a number*"),
        (
            "head -c 100000 /dev/zero | tr '\\0' '[' > /logs/verifier/reward.json",
            "*reward.json nests too deeply to be read*",
        ),
    ],
    ids=["missing", "empty", "word", "json-list", "timeout", "underscore", "deep-json"],
)
def test_unusable_reward_is_an_evaluation_error(pytester: pytest.Pytester, test: str, message: str) -> None:
    write_task(
        pytester.path / "tasks", "t", test=f"#!/bin/bash\n{test}\n", verifier_timeout=1 if "sleep" in test else 60
    )
    write_config(pytester, [harbor_request("rewards", "tasks")])
    result = outcome(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(message.split("\n"))
    detail = details(pytester.path, "rewards")["t"]
    assert detail["status"] == "evaluation_error" and detail["score"] is None
    # One attempt: its metadata is stored once, in the task's (same_as_task names it).
    assert "exit_code" in detail["metadata"]["verifier"]
    assert "metadata" in detail["attempt_results"]["0"]["same_as_task"]


def test_crlf_verifier_is_named_as_such(pytester: pytest.Pytester) -> None:
    write_task(pytester.path / "tasks", "crlf", test="#!/bin/bash\r\necho 1 > /logs/verifier/reward.txt\r\n")
    write_config(pytester, [harbor_request("crlf", "tasks")])
    result = outcome(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test.sh has Windows (CRLF) line endings*"])


def test_reward_json_mean_and_named_key(pytester: pytest.Pytester) -> None:
    test = '#!/bin/bash\necho \'{"a": 1, "b": 0, "note": "x"}\' > /logs/verifier/reward.json\n'
    write_task(pytester.path / "tasks", "t", test=test)
    write_config(
        pytester,
        [
            harbor_request("mean", "tasks", execution={"pass_threshold": 0.5}),
            harbor_request("keyed", "tasks", params={"reward_key": "a"}),
        ],
    )
    outcome(pytester).assert_outcomes(passed=2)
    assert details(pytester.path, "mean")["t"]["score"] == 0.5
    assert details(pytester.path, "keyed")["t"]["score"] == 1.0
    assert details(pytester.path, "keyed")["t"]["metadata"]["rewards"] == {"a": 1.0, "b": 0.0}


def test_an_agent_written_reward_does_not_count(pytester: pytest.Pytester) -> None:
    write_task(pytester.path / "tasks", "t", test="#!/bin/bash\necho no reward written\n")
    cheat = ["sh", "-c", "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"]
    write_config(pytester, [harbor_request("cheat", "tasks", harness="command", harness_params={"command": cheat})])
    outcome(pytester).assert_outcomes(errors=1)


def test_task_errors_named_and_other_tasks_run(pytester: pytest.Pytester) -> None:
    tasks = pytester.path / "tasks"
    write_task(tasks, "ok")
    # A prebuilt image the engine does not have: the task's Dockerfile is built instead.
    write_task(tasks, "prebuilt-elsewhere", environment='docker_image = "agentcompass-absent:never"')
    write_task(tasks, "bad-toml", toml='version = "1.0"\n[agent]\ntimeout_sec = = 3\n')
    write_task(tasks, "gpu", environment="gpus = 1")
    compose = write_task(tasks, "compose")
    (compose / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    write_task(tasks, "no-dockerfile", dockerfile=None)
    write_task(tasks, "absent-image", dockerfile=None, environment='docker_image = "agentcompass-absent:never"')
    write_config(pytester, [harbor_request("errors", "tasks")])
    result = outcome(pytester)
    result.assert_outcomes(passed=2, errors=5)
    result.stdout.fnmatch_lines_random(
        [
            "*bad-toml/task.toml:3: invalid TOML*",
            "*needs 1 GPU(s)*does not expose GPUs*",
            "*docker-compose.yaml: docker compose task environments are not supported yet*",
            "*no-dockerfile/environment/Dockerfile does not exist and *task.toml names no ?environment? docker_image*",
            "*image 'agentcompass-absent:never' (the task's) is not on the engine and the task has no Dockerfile*",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()


def test_docker_image_limits_workdir_and_verifier_env(pytester: pytest.Pytester) -> None:
    # No Dockerfile: the task names its image. Limits become container limits.
    test = """#!/bin/bash
mem=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
cpu=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)
echo "mem=$mem cpu=$cpu pwd=$PWD user=$(id -u) flavour=$FLAVOUR"
[ "$mem" = 67108864 ] && case "$cpu" in 50000*) true;; *) false;; esac && [ "$PWD" = / ] \
  && [ "$(id -u)" = 0 ] && [ "$FLAVOUR" = plain ] && echo 1 > /logs/verifier/reward.txt
"""
    environment = f'docker_image = "{BUSYBOX}"\ncpus = 0.5\nmemory = "64M"\n'
    task = write_task(pytester.path / "tasks", "limits", test=test, dockerfile=None, environment=environment)
    toml = (task / "task.toml").read_text().replace("[verifier]\n", '[verifier]\nenv = { FLAVOUR = "plain" }\n')
    (task / "task.toml").write_text(toml)
    # The busybox image has no bash: give the verifier one through the oracle.
    (task / "solution" / "solve.sh").write_text("true\n")
    write_config(
        pytester,
        [harbor_request("limits", "tasks", harness="command", harness_params={"command": ["sh", "-c", SHIM]})],
    )
    result = outcome(pytester)
    result.assert_outcomes(passed=1)


def test_env_tables_take_host_variables_and_keep_them_secret(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "judge-key-" + uuid.uuid4().hex
    monkeypatch.setenv("HARBOR_TEST_JUDGE_KEY", secret)
    monkeypatch.delenv("HARBOR_TEST_UNSET", raising=False)
    tasks = pytester.path / "tasks"
    test = (
        '#!/bin/bash\necho "key=$JUDGE_KEY mode=$MODE"\n'
        '[ "$JUDGE_KEY" = "$EXPECTED" ] && echo 1 > /logs/verifier/reward.txt\n'
    )
    for name, key in (("set", "${HARBOR_TEST_JUDGE_KEY}"), ("unset", "${HARBOR_TEST_UNSET}")):
        task = write_task(tasks, name, test=test)
        toml = (task / "task.toml").read_text()
        env = f'[verifier.env]\nJUDGE_KEY = "{key}"\nMODE = "${{HARBOR_TEST_UNSET:-fallback}}"\nEXPECTED = "{secret}"\n'
        (task / "task.toml").write_text(toml + env)
    write_config(pytester, [harbor_request("env", "tasks")])
    result = outcome(pytester)
    result.assert_outcomes(passed=1, errors=1)  # a task that cannot be verified is an error, not a 0
    result.stdout.fnmatch_lines(
        ["*task.toml:*: [[]verifier.env[]] JUDGE_KEY needs the environment variable HARBOR_TEST_UNSET*"]
    )
    done = details(pytester.path, "env")
    assert done["set"]["score"] == 1.0
    assert "mode=fallback" in done["set"]["metadata"]["verifier"]["stdout_tail"]
    folder = run_dir(pytester.path, "env")
    # The key the verifier printed is masked in everything the run wrote.
    assert not [p for p in folder.rglob("*") if p.is_file() and secret in p.read_text(errors="replace")]


def test_command_harness_sees_instruction_but_not_tests(pytester: pytest.Pytester) -> None:
    write_task(
        pytester.path / "tasks",
        "t",
        test='#!/bin/bash\n[ "$(cat /app/said)" = "Task t." ] && echo 1 > /logs/verifier/reward.txt\n',
    )
    agent = ["sh", "-c", 'test ! -e /tests && test ! -e /solution && printf "%s" "$AGENTCOMPASS_PROMPT" > /app/said']
    write_config(pytester, [harbor_request("cmd", "tasks", harness="command", harness_params={"command": agent})])
    outcome(pytester).assert_outcomes(passed=1)


def test_image_tag_follows_context_and_base_image(tmp_path: Path) -> None:
    # In a child process: the SDK's HTTP session is kept out of the test worker.
    script = f"""
import io, sys, uuid
from pathlib import Path
import docker
from pytest_agentcompass.environments.docker_images import image_tag
client = docker.from_env()
base = "agentcompass-test-base:" + uuid.uuid4().hex[:12]
context = Path(sys.argv[1])
(context / "Dockerfile").write_text(f"FROM {{base}} AS build\\nFROM build\\nFROM scratch\\n")
try:
    absent = image_tag(client, context)
    client.images.get("{BUSYBOX}").tag(base)
    on_busybox = image_tag(client, context)
    assert on_busybox != absent and on_busybox == image_tag(client, context)
    (context / "extra.txt").write_text("x")
    changed = image_tag(client, context)
    assert changed != on_busybox
    deep = context / "src" / "pkg" / "deep"
    deep.mkdir(parents=True)
    (deep / "mod.py").write_text("a")
    nested = image_tag(client, context)
    assert nested != changed
    (deep / "mod.py").write_text("b")  # same size, same name, new content
    assert image_tag(client, context) != nested
    (deep / "mod.py").chmod(0o755)
    assert image_tag(client, context) not in (nested, changed)
    changed = image_tag(client, context)
    other, _ = client.images.build(fileobj=io.BytesIO(f"FROM {BUSYBOX}\\nLABEL o={{base}}\\n".encode()), rm=True)
    other.tag(base)  # the same name on another image: another tag
    assert image_tag(client, context) != changed
finally:
    client.images.remove(base, force=True)
print("ok")
"""
    context = tmp_path / "env"
    context.mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(context)], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr


def test_only_the_store_writes_in_the_run_directory(pytester: pytest.Pytester, own_images: list[Path]) -> None:
    """An image build, the agent's run and the verifier: every file and folder under the run
    directory is made by the store (the build log through the provider's ``run_files``)."""
    own_images.append(write_task(pytester.path / "tasks", "built", unique=True))
    write_config(pytester, [harbor_request("written", "tasks")])
    with writes_under(pytester.path / "runs") as writes:
        pytester.runpytest("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    (log,) = (run_dir(pytester.path, "written") / "images").glob("*.log")
    assert "Successfully built" in log.read_text()
    written = {w.path.split(os.sep)[2] for w in writes if w.path.count(os.sep) >= 2}
    assert {"images", "details", "artifacts"} <= written, "the hook saw the run's files"
    assert not_through_the_store(writes) == []


def test_a_task_whose_environment_cannot_be_made_is_a_task_error_not_retried(
    pytester: pytest.Pytester, own_images: list[Path]
) -> None:
    # Each was an environment_error, retried twice and counted as infrastructure: the task's own fault.
    tasks = pytester.path / "tasks"
    own_images.append(write_task(tasks, "run-fails", dockerfile=BUSYBOX_DOCKERFILE + "RUN exit 3\n", unique=True))
    own_images.append(write_task(tasks, "no-parse", dockerfile=BUSYBOX_DOCKERFILE + "FROBNICATE now\n", unique=True))
    shutil.rmtree(write_task(tasks, "no-environment") / "environment")
    write_task(tasks, "gpu", environment="gpus = 1")
    write_config(pytester, [harbor_request("faults", "tasks", execution={"max_retries": 2})])
    result = outcome(pytester)
    result.assert_outcomes(errors=4)
    found = details(pytester.path, "faults")
    assert {name: d["status"] for name, d in found.items()} == dict.fromkeys(
        ("run-fails", "no-parse", "no-environment", "gpu"), "task_error"
    )
    assert all(d.get("retries", 0) == 0 for d in found.values()), {n: d.get("retries") for n, d in found.items()}
    assert not list(run_dir(pytester.path, "faults").glob("retry_details/**/*.json"))
    result.stdout.fnmatch_lines_random(
        [
            "*task_error*run-fails*returned a non-zero code*",
            "*task_error*FROBNICATE*",
            "*task_error*no-environment/environment*",
            "*task_error*needs 1 GPU(s)*",
        ]
    )
    assert "infrastructure" not in result.stdout.str()


def test_a_test_sh_that_is_a_link_inside_tests_gives_no_finding(pytester: pytest.Pytester) -> None:
    # Staged as a link, it was reported "/tests/test.sh is gone after the verifier ran".
    task = write_task(pytester.path / "tasks", "linked")
    (task / "tests" / "run.sh").write_text((task / "tests" / "test.sh").read_text())
    (task / "tests" / "test.sh").unlink()
    (task / "tests" / "test.sh").symlink_to("run.sh")
    write_config(pytester, [harbor_request("linked", "tasks")])
    outcome(pytester).assert_outcomes(passed=1)
    record = details(pytester.path, "linked")["linked"]
    assert record["score"] == 1.0 and not record["metadata"].get("integrity"), record["metadata"].get("integrity")


def test_a_task_toml_gone_after_collection_is_a_task_error_naming_it(pytester: pytest.Pytester) -> None:
    task = write_task(pytester.path / "tasks", "vanishing")
    write_config(pytester, [harbor_request("gone", "tasks", execution={"max_retries": 2})])
    pytester.makeconftest(
        f"""
import os

def pytest_collection_finish(session):
    os.remove({str(task / "task.toml")!r})
"""
    )
    result = outcome(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*task_error*vanishing/task.toml is gone since the task was collected*"])
    record = details(pytester.path, "gone")["vanishing"]
    assert (record["status"], record["retries"]) == ("task_error", 0)
