"""Configs work from any folder, and their node ids work as pytest arguments wherever the config lives."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "example_suites").glob("*/*.yaml"))


@pytest.fixture
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the examples in a folder that is neither the working directory nor under the rootdir."""
    folder = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "example_suites", folder / "example_suites")
    return folder


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_config_loads_from_another_folder(
    pytester: pytest.Pytester, checkout: Path, example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"OPENAI_MODEL": "m", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "k"}.items():
        monkeypatch.setenv(name, value)  # what the agent examples ask for
    config = checkout / example.relative_to(ROOT)
    result = pytester.runpytest(f"--agentcompass={config}", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    ids = [line for line in result.stdout.lines if "::" in line]
    assert ids and all(line.startswith(f"{config.as_posix()}::") for line in ids)
    assert not list(checkout.rglob(".agentcompass"))  # collecting writes nothing


def junit_ids(path: Path) -> list[tuple[str, str]]:
    return [(case.get("classname", ""), case.get("name", "")) for case in ET.parse(path).getroot().iter("testcase")]


def test_node_ids_of_a_config_outside_the_rootdir_can_be_passed_back(pytester: pytest.Pytester, checkout: Path) -> None:
    config = checkout / "example_suites/quickstart/agentcompass.yaml"
    option = f"--agentcompass={config}"
    result = pytester.runpytest(option, "-rf", "--junitxml=junit.xml")
    result.assert_outcomes(passed=9, failed=3)
    failed = sorted(line.split()[1] for line in result.stdout.lines if line.startswith("FAILED "))
    prefix = config.as_posix()
    assert failed == [f"{prefix}::arithmetic::arith-{i:03d}" for i in (5, 8, 11)]
    # The config file's name and the request: no leading dot, whatever the rootdir (was ".<path>.arithmetic").
    assert ("agentcompass.yaml.arithmetic", "arith-005") in junit_ids(pytester.path / "junit.xml")

    # One node id from the output: exactly that task runs, from here or from anywhere.
    again = pytester.runpytest(option, failed[0], "-v", "-p", "no:cacheprovider")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*arithmetic::arith-005 FAILED*"])
    assert "arith-000" not in again.stdout.str()

    # --lf: the three failures of the first run, nothing else.
    last_failed = pytester.runpytest(option, "--lf", "-v")
    last_failed.assert_outcomes(failed=3)
    assert "9 deselected" in last_failed.stdout.str()
