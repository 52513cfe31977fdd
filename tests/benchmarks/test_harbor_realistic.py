"""Tasks shaped like published Terminal-Bench 2 tasks (``FROM python:3.13-slim-bookworm`` /
``ubuntu:24.04``, a WORKDIR, pytest verifiers, the verifier preludes that fetch curl and
uv) on base images built offline by ``scripts/build-base-images.sh``.

The verifier runs without network here (``network.evaluation: disabled``), as
it would offline: the fetches fail at once and the base image's uv stand-in
runs the installed pytest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from harbor_tasks import containers_of, details, harbor_request, require_images, run_dir

from conftest import write_config

SUITE = Path(__file__).parents[1] / "suites" / "harbor_realistic"
BASES = ("python:3.12-slim", "python:3.13-slim-bookworm", "ubuntu:24.04")
OFFLINE = {"network": {"evaluation": "disabled"}}


require_images(*BASES, hint="run scripts/build-base-images.sh")


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process-loop", "xdist"])
def test_oracle_passes_nop_fails(pytester: pytest.Pytester, workers: list[str]) -> None:
    shutil.copytree(SUITE, pytester.path / "tasks")
    write_config(
        pytester,
        [
            harbor_request("oracle", "tasks", environment=OFFLINE),
            harbor_request("nop", "tasks", harness="nop", environment=OFFLINE),
        ],
    )
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", *workers)
    result.assert_outcomes(passed=5, failed=5)
    # storage_mb, which this engine cannot apply: one note per request, not a warning per task.
    assert result.stdout.str().count("note: storage_mb (a task's disk quota) is not applied") == 2
    assert "storage" not in result.stderr.str()
    oracle, nop = details(pytester.path, "oracle"), details(pytester.path, "nop")
    assert {t: d["score"] for t, d in oracle.items()} == dict.fromkeys(oracle, 1.0)
    assert {t: d["score"] for t, d in nop.items()} == dict.fromkeys(nop, 0.0)
    # The pytest verdict is kept with the verifier's output.
    verifier = run_dir(pytester.path, "oracle") / "artifacts" / "csv-summary" / "attempt-0" / "verifier"
    assert "2 passed" in (verifier / "test-stdout.txt").read_text()
    assert json.loads((verifier / "logs" / "ctrf.json").read_text())["results"]["summary"]["passed"] == 2
    # The published uvx / uv-project preludes ran offline on the stand-in, which said so.
    for task, passed in (("word-frequency", 2), ("inventory-report", 3)):
        verifier = run_dir(pytester.path, "oracle") / "artifacts" / task / "attempt-0" / "verifier"
        assert f"{passed} passed" in (verifier / "test-stdout.txt").read_text()
        assert "uv (offline stand-in)" in (verifier / "test-stderr.txt").read_text()
    assert (
        json.loads(
            (
                run_dir(pytester.path, "oracle")
                / "artifacts"
                / "word-frequency"
                / "attempt-0"
                / "verifier"
                / "logs"
                / "ctrf.json"
            ).read_text()
        )["results"]["summary"]["passed"]
        == 2
    )
    for request in ("oracle", "nop"):
        assert containers_of(run_dir(pytester.path, request).name) == []


def test_selection_by_category_and_tag(pytester: pytest.Pytester) -> None:
    shutil.copytree(SUITE, pytester.path / "tasks")
    write_config(pytester, [harbor_request("oracle", "tasks")])
    result = pytester.runpytest_subprocess(
        "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider", "-m", "git or debugging"
    )
    result.assert_outcomes(passed=3)
    assert set(details(pytester.path, "oracle")) == {"git-recover-commit", "fix-off-by-one", "inventory-report"}
