"""Reading Harbor task directories: no engine needed, nothing built at collection."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from harbor_tasks import harbor_request, write_task

from pytest_agentcompass import ComponentRef, ExecutionPlan, RunRequest
from pytest_agentcompass.benchmarks.harbor.discovery import files_digest, find_task_dirs, task_id_for
from pytest_agentcompass.benchmarks.harbor.rewards import RewardError, parse_rewards
from pytest_agentcompass.benchmarks.harbor.taskdir import expand_env, parse_memory_mb, read_task

from conftest import write_config

REALISTIC = Path(__file__).parents[1] / "suites" / "harbor_realistic"


def test_published_shapes_are_read_with_unknown_keys_kept() -> None:
    task = read_task(REALISTIC / "fix-off-by-one")
    assert task.error is None
    assert (task.category, task.tags) == ("software-engineering", ("python", "debugging"))
    assert (task.agent_timeout, task.verifier_timeout, task.build_timeout) == (300.0, 120.0, 600.0)
    assert (task.cpus, task.memory_mb, task.storage_mb, task.gpus) == (1.0, 1024, 4096, 0)
    assert task.verifier_env == {"PAGE_SIZE": "3"} and task.solution_env == {} and task.workdir == "/app"
    assert task.config["environment"]["mcp_servers"] == [] and task.config["schema_version"] == "1.1"
    csv = read_task(REALISTIC / "csv-summary")
    assert (csv.memory_mb, csv.storage_mb) == (2048, 10240)  # the deprecated memory = "2G", storage = "10G"
    word = read_task(REALISTIC / "word-frequency")  # schema 1.1 with [[task.authors]], artifacts, empty env tables
    assert word.error is None and word.config["artifacts"] == [] and word.verifier_env["EXPECTED_TOP_N"]
    assert read_task(REALISTIC / "git-recover-commit").allow_internet is False  # network_mode = "none"


@pytest.mark.parametrize(
    ("value", "mb"), [("4G", 4096), ("512M", 512), ("2048Mi", 2048), ("1.5g", 1536), ("10 GB", 10240), ("lots", None)]
)
def test_memory_sizes(value: str, mb: int | None) -> None:
    assert parse_memory_mb(value) == mb


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('version = "1.0"\n[agent]\ntimeout_sec = = 3\n', "task.toml:3: invalid TOML"),
        ('version = "1.0"\n\n[verifier]\ntimeout_sec = "soon"\n', "task.toml:4: [verifier] timeout_sec must be"),
        ('[environment]\nmemory = "plenty"\n', "task.toml:2: [environment] memory must be a size"),
        ('[environment]\nallow_internet = "yes"\n', "task.toml:2: [environment] allow_internet must be"),
        ("verifier = 3\n", "task.toml:1: verifier must be a table"),
    ],
)
def test_broken_task_toml_names_file_and_line(tmp_path: Path, toml: str, message: str) -> None:
    task = write_task(tmp_path, "t", toml=toml)
    parsed = read_task(task)
    assert parsed.error is not None and f"{task}/{message}" in parsed.error


def test_rewards() -> None:
    assert parse_rewards(b" 0.25\n", None).score == 0.25
    assert parse_rewards(b"1", b'{"reward": 0}').score == 1.0  # reward.txt wins, as in Harbor
    both = parse_rewards(None, b'{"reward": 0.5, "style": 1, "note": "x", "flag": true}')
    assert (both.score, dict(both.values)) == (0.5, {"reward": 0.5, "style": 1.0})
    assert parse_rewards(None, b'{"a": 1, "b": 0}').score == 0.5
    assert parse_rewards(None, b'{"a": 1, "b": 0}', key="b").score == 0.0
    for txt, js, key in [
        (b"", None, None),
        (b"nan", None, None),
        (None, None, None),
        (None, b"{}", None),
        (None, b'{"a": 1}', "b"),
        (None, b"not json", None),
    ]:
        with pytest.raises(RewardError):
            parse_rewards(txt, js, key)


def test_many_task_dirs_collect_without_building(pytester: pytest.Pytester) -> None:
    tasks = pytester.path / "tasks"
    for i in range(1000):
        write_task(tasks / f"group-{i % 3}", f"task-{i:04d}", dockerfile="FROM no-such-image:never\n")
    (tasks / "README.md").write_text("plain files beside task dirs are ignored\n")
    assert len(list(find_task_dirs(tasks))) == 1000
    write_config(pytester, [harbor_request("many", "tasks")])
    result = pytester.runpytest_inprocess(
        "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "--collect-only", "-q"
    )
    assert result.ret == 0
    assert "1000 tests collected" in result.stdout.str()


def test_keywords_and_markers_select(pytester: pytest.Pytester) -> None:
    tasks = pytester.path / "tasks"
    write_task(tasks, "a", category="data-processing", tags=["text", "easy one"])
    write_task(tasks, "b", category="security", tags=["crypto"])
    write_task(tasks, "c", category="data-processing", tags=["crypto"])
    write_config(pytester, [harbor_request("sel", "tasks")])
    base = ["--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "--collect-only", "-q"]

    def selected(*args: str) -> set[str]:
        out = pytester.runpytest_inprocess(*base, *args).stdout.lines
        return {line.rsplit("::", 1)[1] for line in out if "::" in line}

    assert selected("-m", "crypto") == {"b", "c"}
    assert selected("-m", "data-processing and not crypto") == {"a"}
    assert selected("-m", "easy_one") == {"a"}
    assert selected("-k", "security or text") == {"a", "b"}


def test_missing_path_is_one_clear_error(pytester: pytest.Pytester) -> None:
    write_config(pytester, [harbor_request("gone", "no-such-folder")])
    result = pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*params.path */no-such-folder is not a folder"])
    assert "INTERNALERROR" not in result.stdout.str()


def test_unknown_param_is_refused(pytester: pytest.Pytester) -> None:
    write_config(pytester, [harbor_request("typo", "tasks", params={"pth": "x"})])
    result = pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*pth*"])
    assert "INTERNALERROR" not in result.stdout.str()


def test_gates_a_harbor_request_can_never_meet_are_config_errors(pytester: pytest.Pytester) -> None:
    # Both were accepted and failed only after every task had run: "rewards" is a mapping of
    # means, and a run with k=1 has no pass@2.
    write_task(pytester.path / "tasks", "a")
    write_config(pytester, [harbor_request("h", "tasks", gates={"rewards": 0.5, "pass@2": 0.5, "pass@1": 0.5})])
    result = pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*agentcompass.yaml:*: requests[[]0[]].gates.rewards: unknown metric 'rewards'; HarborBenchmark returns: *",
            "*agentcompass.yaml:*: requests[[]0[]].gates.pass@2: unknown metric 'pass@2'; *pass@1*",
        ]
    )
    assert "pass@<k>" not in result.stdout.str() and "INTERNALERROR" not in result.stdout.str()


@pytest.mark.parametrize(
    "rel",
    [
        "task.toml",
        "instruction.md",
        "tests/test.sh",
        "tests/helpers/deep/check.py",
        "solution/solve.sh",
        "solution/data/answer.txt",
        "environment/Dockerfile",
        "environment/src/app/deep/module.py",
    ],
)
def test_editing_any_file_of_a_task_changes_its_fingerprint_input(tmp_path: Path, rel: str) -> None:
    import os

    task = write_task(tmp_path, "t")
    for extra in ("tests/helpers/deep/check.py", "solution/data/answer.txt", "environment/src/app/deep/module.py"):
        (task / extra).parent.mkdir(parents=True, exist_ok=True)
        (task / extra).write_text("one\n")
    before = files_digest(task)
    assert files_digest(task) == before
    edited = task / rel
    info = edited.stat()
    # The same size and the same modification time: only the content (or, deep in
    # environment/, where stat is all that is read, the time of the edit) tells.
    edited.write_text(edited.read_text()[:-1] + "X")
    if rel.startswith("environment/"):
        os.utime(edited, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000))
    else:
        os.utime(edited, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert files_digest(task) != before


def test_a_new_file_or_an_executable_bit_changes_the_fingerprint_input(tmp_path: Path) -> None:
    task = write_task(tmp_path, "t")
    before = files_digest(task)
    (task / "environment" / "nested" / "more").mkdir(parents=True)
    (task / "environment" / "nested" / "more" / "new.txt").write_text("")
    added = files_digest(task)
    assert added != before
    (task / "tests" / "test.sh").chmod(0o755)
    assert files_digest(task) != added


def _plan(
    benchmark: Any, task: Any, evaluation_mode: str | None = None, network: dict[str, str] | None = None
) -> ExecutionPlan:
    from pytest_agentcompass.config import EnvironmentSpec

    req = RunRequest(
        name="r",
        benchmark=ComponentRef(id="harbor"),
        environment=EnvironmentSpec(id="docker", evaluation_environment_mode=evaluation_mode, network=network or {}),
    )
    plan = ExecutionPlan(task.task_id, 0, evaluation_mode or "reuse")  # type: ignore[arg-type]
    adjusted: ExecutionPlan = benchmark.adjust_plan(plan, task, req)
    return adjusted


def test_verifier_modes_become_plans(tmp_path: Path) -> None:
    from pytest_agentcompass.benchmarks.harbor.benchmark import HarborBenchmark

    tasks = tmp_path / "tasks"
    write_task(tasks, "plain", environment="storage_mb = 4096\nallow_internet = false\n")
    apart = write_task(tasks, "apart", toml='[verifier]\ntimeout_sec = 60\nenvironment_mode = "separate"\n')
    (apart / "tests" / "Dockerfile").write_text("FROM scratch\nCOPY . /tests\n")
    own = write_task(
        tasks,
        "own-env",
        toml='[verifier.environment]\ndocker_image = "verifier:1"\ncpus = 2\nallow_internet = false\n',
    )
    assert read_task(own).verifier_mode == "separate"  # a [verifier.environment] table alone means separate
    by_id = {t.task_id: t for t in HarborBenchmark(tasks).load_tasks(_request())}

    def plan(task: str, param: str | None = None, **extra: Any) -> ExecutionPlan:
        benchmark = HarborBenchmark(tasks, verifier_mode=param)  # type: ignore[arg-type]
        return _plan(benchmark, by_id[task], **extra)

    shared = plan("plain")
    assert (shared.environment["verifier_mode"], shared.evaluation_environment_mode) == ("shared", "reuse")
    assert shared.environment["storage_mb"] == 4096 and "evaluation" not in shared.environment
    # The task has no internet: neither have the agent's processes that outlive it into verification.
    assert (shared.run_network_policy, shared.evaluation_network_policy) == ("disabled", "disabled")
    assert plan("plain", network={"evaluation": "full"}).evaluation_network_policy == "full"
    snapshot = plan("plain", "snapshot")
    assert (snapshot.evaluation_environment_mode, snapshot.environment["evaluation"]) == (
        "fresh",
        {"from_snapshot": True},
    )
    # The spec's fresh evaluation of a Harbor task is the snapshot (a separate task keeps its own verifier).
    assert plan("plain", evaluation_mode="fresh").environment["verifier_mode"] == "snapshot"
    assert plan("apart", evaluation_mode="fresh").environment["verifier_mode"] == "separate"
    assert plan("apart", evaluation_mode="reuse").environment["verifier_mode"] == "shared"
    separate = plan("apart")
    assert separate.environment["verifier_mode"] == "separate" and separate.evaluation_environment_mode == "fresh"
    build = separate.environment["evaluation"]["build"]
    assert build["context"] == str(apart / "tests") and separate.environment["evaluation"]["image"] is None
    own_env = plan("own-env").environment["evaluation"]
    assert own_env["task_image"] == "verifier:1" and own_env["cpus"] == 2.0
    assert plan("own-env").evaluation_network_policy == "disabled"
    assert "evaluation" not in plan("plain", "separate").environment  # no verifier image: the task's own


def _request(**environment: Any) -> RunRequest:
    from pytest_agentcompass.config import EnvironmentSpec

    return RunRequest(name="r", benchmark=ComponentRef(id="harbor"), environment=EnvironmentSpec(**environment))


@pytest.mark.parametrize(
    ("params", "environment", "message"),
    [
        (
            {"verifier_mode": "shared"},
            {"evaluation_environment_mode": "fresh"},
            "*verifier_mode 'shared' needs*'reuse'*'fresh'*",
        ),
        (
            {},
            {"evaluation_environment_mode": "none"},
            "*evaluation_environment_mode 'none' cannot verify a Harbor task*",
        ),
        ({"verifier_mode": "isolated"}, {}, "*verifier_mode*"),
        ({"reward_range": [1, 0]}, {}, "*reward_range must be two finite numbers*"),
    ],
    ids=["mode-conflict", "none", "unknown-mode", "range"],
)
def test_contradicting_settings_are_one_clear_error(
    pytester: pytest.Pytester, params: dict[str, Any], environment: dict[str, Any], message: str
) -> None:
    write_task(pytester.path / "tasks", "t")
    write_config(pytester, [harbor_request("bad", "tasks", params=params, environment=environment)])
    result = pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([message])
    assert "INTERNALERROR" not in result.stdout.str() and result.ret != 0


def test_broken_tasks_are_task_errors_never_retried_nor_infrastructure(pytester: pytest.Pytester) -> None:
    tasks = pytester.path / "tasks"
    write_task(tasks, "lots", environment='memory = "lots"')
    write_task(tasks, "empty-dockerfile", dockerfile="# nothing here\n\n")
    (write_task(tasks, "no-instruction") / "instruction.md").unlink()
    (write_task(tasks, "no-verifier") / "tests" / "test.sh").unlink()
    # No engine is needed: a broken task opens no environment (the provider here would fail preflight-free).
    write_config(
        pytester,
        [harbor_request("broken", "tasks", execution={"max_retries": 2}, environment={"id": "local"})],
    )
    result = pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines_random(
        [
            "*ERROR at setup of broken::lots*",
            "*task_error: */lots/task.toml:*: [[]environment[]] memory must be a size like*",
            "*task_error: */empty-dockerfile/environment/Dockerfile is empty*",
            "*task_error: */no-instruction/instruction.md: cannot read*",
            "*task_error: */no-verifier/tests/test.sh does not exist: the task has no verifier*",
            "broken: 4 tasks, 0 passed, 0 failed, 4 errors (4 task)*",
        ]
    )
    summary = json.loads(next((pytester.path / "runs" / "broken").glob("*/summary.json")).read_text())
    assert summary["counts"]["task_errors"] == 4 and summary["counts"]["environment_errors"] == 0
    assert summary["counts"]["retries"] == 0
    detail = json.loads(next((pytester.path / "runs" / "broken").glob("*/details/lots.json")).read_text())
    assert (detail["status"], detail["attempts"], detail["attempt_results"]) == ("task_error", 0, {})


def test_odd_directory_names_get_ids_that_work(pytester: pytest.Pytester) -> None:
    tasks = pytester.path / "tasks"
    for name in ("my task", "café-ünïcode", "plain"):
        write_task(tasks, name)
    write_config(pytester, [harbor_request("odd", "tasks", environment={"id": "local"})])
    result = pytester.runpytest_inprocess(
        "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "--collect-only", "-q"
    )
    assert result.ret == 0, result.stdout.str()
    ids = sorted(line.rsplit("::", 1)[1] for line in result.stdout.lines if "::" in line)
    assert ids[0].startswith("cafe-unicode-") and ids[1].startswith("my-task-") and ids[2] == "plain"
    assert task_id_for("my task") == ids[1]  # stable: the same name, the same id
    again = pytester.runpytest_inprocess(
        "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "--collect-only", "-q", "-k", ids[1]
    )
    assert again.ret == 0 and f"::{ids[1]}" in again.stdout.str()
    # The real folder name selects too (-k matched only the id it was given).
    by_name = pytester.runpytest_inprocess(
        "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "--collect-only", "-q", "-k", "café-ünïcode"
    )
    chosen = [line for line in by_name.stdout.lines if "::" in line]
    assert by_name.ret == 0 and chosen == [f"agentcompass.yaml::odd::{ids[0]}"]


def test_a_duplicate_id_names_both_directories(pytester: pytest.Pytester) -> None:
    tasks = pytester.path / "tasks"
    write_task(tasks / "sub1", "dup")
    write_task(tasks / "sub2", "dup")
    write_config(pytester, [harbor_request("dups", "tasks")])
    result = pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*two task directories have the id 'dup': sub1/dup and sub2/dup*"])
    assert "INTERNALERROR" not in result.stdout.str()


def test_reward_range_size_and_ignored_entries() -> None:
    from pytest_agentcompass.benchmarks.harbor.benchmark import _rewards

    assert _rewards({"reward.txt": b"0.5"}, None, (0.0, 1.0)).score == 0.5
    for text, shown in ((b"1e300", "'1e300'"), (b"-5", "'-5'")):
        with pytest.raises(RewardError, match=f"reward.txt holds {shown}, outside the reward range \\[0, 1\\]"):
            _rewards({"reward.txt": text}, None, (0.0, 1.0))
    assert _rewards({"reward.txt": b"7"}, None, None).score == 7.0  # reward_range: null
    with pytest.raises(RewardError, match=r"reward.json holds b = 3.0, outside the reward range"):
        _rewards({"reward.json": b'{"reward": 1, "b": 3}'}, None, (0.0, 1.0))
    with pytest.raises(RewardError, match=r"reward.txt is 62914560 bytes, too large to be a reward"):
        _rewards({"reward.txt": 60 * 1024 * 1024}, None, (0.0, 1.0))
    odd = b'{"": 1, "bad key/with slash": 1, "Reward": "high", "flag": true, "ok": 0.25}'
    verdict = _rewards({"reward.json": odd}, None, (0.0, 1.0))
    assert (verdict.score, dict(verdict.values)) == (0.25, {"ok": 0.25})
    assert [entry.split(":")[0] for entry in verdict.ignored] == ["''", "'bad key/with slash'", "'Reward'", "'flag'"]
    assert "'high' is not a number" in verdict.ignored[2]
    with pytest.raises(RewardError, match="holds no usable numbers \\(ignored: 'Reward': 'high' is not a number"):
        _rewards({"reward.json": b'{"Reward": "high"}'}, None, (0.0, 1.0))


def test_an_unset_verifier_variable_is_found_before_the_agent_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was found by the verifier, after the agent had run (and spent its model calls).
    monkeypatch.delenv("HARBOR_TEST_NEVER_SET", raising=False)
    task = write_task(pytester.path / "tasks", "judged")
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml + '[verifier.env]\nJUDGE_KEY = "${HARBOR_TEST_NEVER_SET}"\n')
    marker = pytester.path / "agent-ran"
    harness = {"command": ["sh", "-c", f"touch {marker}"]}
    request = harbor_request("env", "tasks", harness="command", harness_params=harness, environment={"id": "local"})
    write_config(pytester, [request])
    result = pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*task_error: */judged/task.toml:*: [[]verifier.env[]] JUDGE_KEY needs the environment variable "
            "HARBOR_TEST_NEVER_SET, which is not set*"
        ]
    )
    assert not marker.exists()


def test_a_renamed_directory_keeps_its_real_name_in_the_detail(pytester: pytest.Pytester) -> None:
    # The README promised metadata.directory; no detail held it.
    tasks = pytester.path / "tasks"
    write_task(tasks, "my task", environment='memory = "lots"')  # broken: recorded without opening anything
    write_config(pytester, [harbor_request("odd", "tasks", environment={"id": "local"})])
    pytester.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider").assert_outcomes(errors=1)
    (detail_file,) = (pytester.path / "runs" / "odd").glob("*/details/my-task-*.json")
    detail = json.loads(detail_file.read_text())
    assert detail["task_metadata"]["directory"] == "my task"
    assert detail["task_metadata"]["path"] == str(tasks / "my task")


def test_a_test_sh_link_that_leaves_tests_is_named(tmp_path: Path) -> None:
    # A dangling link was "tests/test.sh does not exist: the task has no verifier".
    for name, target in (("dangling", "missing.sh"), ("absolute", "/etc/hostname"), ("escaping", "../instruction.md")):
        task = write_task(tmp_path, name)
        (task / "tests" / "test.sh").unlink()
        (task / "tests" / "test.sh").symlink_to(target)
        error = read_task(task).error
        assert error is not None and error.startswith(f"{task}/tests/test.sh is a symbolic link to {target}, which "), (
            error
        )
    inside = write_task(tmp_path, "inside")
    (inside / "tests" / "run.sh").write_text((inside / "tests" / "test.sh").read_text())
    (inside / "tests" / "test.sh").unlink()
    (inside / "tests" / "test.sh").symlink_to("run.sh")
    assert read_task(inside).error is None


def test_verifier_env_takes_a_required_variable_and_a_literal_dollar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HARBOR_TEST_NEVER_SET", raising=False)
    task = write_task(tmp_path, "t")
    toml = (task / "task.toml").read_text()
    env = '[verifier.env]\nPRICE = "$${literal}"\nKEY = "${HARBOR_TEST_NEVER_SET:?ask the team for a judge key}"\n'
    (task / "task.toml").write_text(toml + env)
    error = read_task(task).error
    assert error is not None and error.endswith(
        "[verifier.env] KEY needs the environment variable HARBOR_TEST_NEVER_SET (ask the team for a judge key), "
        "which is not set"
    ), error
    monkeypatch.setenv("HARBOR_TEST_NEVER_SET", "k")
    parsed = read_task(task)
    assert parsed.error is None
    assert expand_env(parsed.verifier_env, "verifier", parsed) == {"PRICE": "${literal}", "KEY": "k"}


@pytest.mark.parametrize(
    ("rel", "target", "why"),
    [
        ("instruction.md", "/proc/self/environ", "which is outside the task folder"),
        ("instruction.md", "../secret.txt", "which is outside the task folder"),
        ("instruction.md", "gone.md", "which does not exist"),
        ("task.toml", "/etc/hostname", "which is outside the task folder"),
        ("solution/solve.sh", "/etc/passwd", "which is outside the task folder"),
        ("solution", "/", "which is outside the task folder"),
    ],
)
def test_a_task_file_linked_out_of_its_folder_is_named_and_never_read(
    tmp_path: Path, rel: str, target: str, why: str
) -> None:
    # instruction.md was followed to the host file, whose text went to the model.
    task = write_task(tmp_path / "tasks", "t")
    (task.parent / "secret.txt").write_text("host secret\n")
    link = task / rel
    if link.is_dir():
        shutil.rmtree(link)
    else:
        link.unlink()
    link.symlink_to(target)
    parsed = read_task(task)
    assert parsed.error is not None and parsed.error.startswith(f"{link} is a symbolic link to {target}, {why}")
    assert "host secret" not in parsed.instruction
    files_digest(task)  # a folder linked to / is not walked


def test_a_link_that_stays_inside_the_task_folder_is_read(tmp_path: Path) -> None:
    task = write_task(tmp_path, "t")
    (task / "docs.md").write_text("the real instruction\n")
    (task / "instruction.md").unlink()
    (task / "instruction.md").symlink_to("docs.md")
    parsed = read_task(task)
    assert parsed.error is None and parsed.instruction == "the real instruction\n"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("memory_mb = 99999999999999999999", "[environment] memory_mb is 99999999999999999999, more than"),
        ('memory = "99999999T"', "[environment] memory is 104857598951424 (in MB), more than 16777216"),
        ("storage_mb = 1e300", "[environment] storage_mb is 1e+300, more than"),
        ("cpus = 100000", "[environment] cpus is 100000, more than 4096"),
        ("build_timeout_sec = 1e12", "[environment] build_timeout_sec is 1000000000000.0, more than 604800"),
    ],
)
def test_a_resource_beyond_any_machine_is_a_task_error_at_load(tmp_path: Path, line: str, message: str) -> None:
    # memory_mb = 99999999999999999999 became a Docker traceback (int64 overflow), retried as transient.
    task = write_task(tmp_path, "t", toml=f'version = "1.0"\n\n[environment]\n{line}\n')
    parsed = read_task(task)
    assert parsed.error is not None and parsed.error.startswith(f"{task}/task.toml:4: {message}"), parsed.error


def test_a_timeout_beyond_a_week_names_its_table(tmp_path: Path) -> None:
    task = write_task(tmp_path, "t", toml="[verifier]\ntimeout_sec = 1e300\n")
    assert (
        read_task(task).error
        == f"{task}/task.toml:2: [verifier] timeout_sec is 1e+300, more than 604800, the most it may be"
    )


@pytest.mark.parametrize(
    ("txt", "js", "message"),
    [
        (b"0_1", None, "reward.txt holds '0_1', not a number"),
        ("\u0661".encode(), None, "reward.txt holds '\u0661', not a number"),
        (b"infinity", None, "reward.txt holds 'infinity', not a number"),
        (b"1e999", None, "reward.txt holds '1e999', not a finite number"),
        (None, b"[" * 100000, "reward.json nests too deeply to be read"),
        (None, b'{"reward": ' + b"1" * 5000 + b"}", "reward.json is not usable JSON"),
        (None, b'{"reward": ' + b"9" * 400 + b"}", "reward.json's 'reward' is 9999"),
        (None, b'{"reward": "1"}', "reward.json's 'reward' is '1', not a finite number"),
    ],
    ids=["underscore", "arabic-indic", "infinity", "overflow", "deep", "digits", "huge-int", "string"],
)
def test_a_reward_only_python_would_read_as_a_number_is_an_error(
    txt: bytes | None, js: bytes | None, message: str
) -> None:
    # float() took "0_1" and an Arabic-Indic digit as 1.0; json's recursion printed a raw traceback.
    with pytest.raises(RewardError) as raised:
        parse_rewards(txt, js)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value), str(raised.value)


def test_plain_rewards_in_every_notation_are_read() -> None:
    for text, value in ((b"1", 1.0), (b"-0.5", -0.5), (b".25", 0.25), (b"3.", 3.0), (b"+1E-2\n", 0.01)):
        assert parse_rewards(text, None).score == value


def test_a_hidden_task_folder_is_skipped_with_a_warning_naming_it(pytester: pytest.Pytester) -> None:
    tasks = pytester.path / "tasks"
    write_task(tasks, "..dots")
    write_task(tasks, "plain")
    (tasks / ".git").mkdir()  # no task in it: nothing to say
    write_config(pytester, [harbor_request("hidden", "tasks", environment={"id": "local"})])
    result = pytester.runpytest_inprocess(
        "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "--collect-only", "-q"
    )
    assert result.ret == 0, result.stdout.str()
    assert [line.rsplit("::", 1)[1] for line in result.stdout.lines if "::" in line] == ["plain"]
    result.stdout.fnmatch_lines(["*1 task folder(s) under * skipped because their names start with '.'*: ..dots;*"])
    assert ".git" not in result.stdout.str()
