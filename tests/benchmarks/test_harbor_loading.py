"""Reading Harbor task directories: no engine needed, nothing built at collection."""

from __future__ import annotations

from pathlib import Path

import pytest
from harbor_tasks import harbor_request, write_task

from pytest_agentcompass.benchmarks.harbor.taskdir import files_digest, find_task_dirs, parse_memory_mb, read_task
from pytest_agentcompass.benchmarks.harbor.verifier import RewardError, parse_rewards

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


def test_storage_is_recorded_under_a_name_that_says_so(pytester: pytest.Pytester) -> None:
    from pytest_agentcompass.benchmarks.harbor.benchmark import HarborBenchmark

    tasks = pytester.path / "tasks"
    write_task(tasks, "big", environment="storage_mb = 4096\n")
    write_task(tasks, "small")
    benchmark = HarborBenchmark(tasks)
    env = {t.task_id: benchmark._environment(benchmark.task(t)) for t in benchmark.load_tasks(None)}  # type: ignore[arg-type]
    assert env["big"]["storage_mb_recorded"] == 4096 and "storage_mb" not in env["big"]
    assert "storage_mb_recorded" not in env["small"]
