"""An agent plants test code among its logs: a later plain ``pytest`` in the project must not run it.

The run directory sits under a collected folder (``output_dir: tests/runs``),
the agent writes a ``conftest.py`` and a ``test_pwn.py`` into its logs, and
the ``command`` harness copies them into the run directory. Then plain
``pytest`` runs in the project: in process, and as a subprocess with no
plugin loaded at all (only pytest's own rules can keep it out).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_agentcompass.runtime.store import RunStore, claim_run_dir

from conftest import write_config

PLANT = """
mark="$1"
cat > "$AGENTCOMPASS_LOGS_DIR/conftest.py" <<EOF
open("$mark", "a").write("conftest ran on the host\\n")
EOF
cat > "$AGENTCOMPASS_LOGS_DIR/test_pwn.py" <<EOF
open("$mark", "a").write("test module ran on the host\\n")
def test_pwn():
    pass
EOF
mkdir -p "$AGENTCOMPASS_LOGS_DIR/deeper"
cp "$AGENTCOMPASS_LOGS_DIR/test_pwn.py" "$AGENTCOMPASS_LOGS_DIR/deeper/test_deeper.py"
echo done
"""

BENCH = """
import dataclasses
from pytest_agentcompass import BaseBenchmark, TaskSpec


class Plain(BaseBenchmark):
    def load_tasks(self, req):
        return [TaskSpec("t0")]

    def evaluate(self, task, prepared, result, req, plan, env=None):
        return dataclasses.replace(result, score=1.0)
"""


@pytest.fixture
def planted(pytester: pytest.Pytester) -> Path:
    """A project whose run directory under tests/ holds an agent's conftest.py and test files; the mark path."""
    mark = pytester.path / "pwned.txt"
    pytester.makepyfile(plain=BENCH)
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests/test_ours.py").write_text("def test_ours():\n    pass\n")
    (pytester.path / "pytest.ini").write_text("[pytest]\nnorecursedirs = build\n")  # not even '.*'
    request = {
        "name": "r",
        "benchmark": {"id": "plain.py:Plain"},
        "harness": {"id": "command", "params": {"command": ["sh", "-c", PLANT, "agent", str(mark)]}},
        "environment": {"id": "local"},
    }
    write_config(pytester, [request], output_dir="tests/runs")
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    copied = sorted(p.relative_to(pytester.path).as_posix() for p in (pytester.path / "tests/runs").rglob("*.py"))
    assert any(p.endswith("/conftest.py") for p in copied) and any(p.endswith("/test_pwn.py") for p in copied), copied
    assert not mark.exists()
    return mark


def test_plain_pytest_in_process_does_not_collect_a_run_directory(pytester: pytest.Pytester, planted: Path) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider")  # no --agentcompass: the plugin is installed, idle
    result.assert_outcomes(passed=1)
    assert "test_pwn" not in result.stdout.str() and not planted.exists()


def test_plain_pytest_without_the_plugin_does_not_collect_a_run_directory(
    pytester: pytest.Pytester, planted: Path
) -> None:
    # No plugin at all: pytest's own rule (a folder holding pyvenv.cfg is skipped) is what keeps it out.
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": ""}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA"],
        cwd=pytester.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "test_pwn" not in proc.stdout, proc.stdout
    assert not planted.exists(), planted.read_text()


def test_even_the_run_directory_as_an_argument_collects_nothing_of_the_agents(
    pytester: pytest.Pytester, planted: Path
) -> None:
    # pytest tests/runs: the folder asked for is recursed into, its run directories are not.
    result = pytester.runpytest("-p", "no:cacheprovider", "tests/runs")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert not planted.exists()


def test_a_run_directory_made_before_the_marker_gets_it_when_claimed(tmp_path: Path) -> None:
    run_dir = tmp_path / "r" / "20250101T000000000000-abcd"
    run_dir.mkdir(parents=True)
    RunStore(run_dir).write_run_info({"run_id": run_dir.name, "status": "interrupted"})
    claim_run_dir(run_dir, "r", "fingerprint")
    assert (run_dir / "pyvenv.cfg").is_file()
