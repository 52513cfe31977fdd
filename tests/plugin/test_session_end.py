"""The end of a session: the plugin's own garbage collection changes nothing pytest reports.

The plugin collects the session's last garbage itself and freezes what
survives, so pytest's five collections at exit walk only what is new
(``plugin/__init__.py``, ``_collect_before_pytest``). These tests hold it to
pytest's contract: a finalizer that raises at the end is still reported, and
nothing stays frozen once pytest is done.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest

from conftest import tracing_request, write_config

# Garbage made once every other plugin is done: a cycle whose finalizer
# raises, and makes a second such cycle as it goes (garbage only after the
# first collection).
CONFTEST = """
class Second:
    def __init__(self):
        self.me = self

    def __del__(self):
        raise RuntimeError("second finalizer failed")


class First:
    def __init__(self):
        self.me = self

    def __del__(self):
        Second()
        raise RuntimeError("first finalizer failed")


def pytest_unconfigure(config):
    First()
"""


@pytest.fixture
def suite(pytester: pytest.Pytester, trace: Path) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    write_config(pytester, [tracing_request("quick", trace, n=3)])
    return pytester


@pytest.mark.parametrize("with_plugin", [True, False], ids=["agentcompass", "plain"])
def test_a_finalizer_failing_at_the_end_is_still_reported(suite: pytest.Pytester, with_plugin: bool) -> None:
    suite.makepyfile(test_plain="def test_one():\n    pass\n")
    args = ["--agentcompass=agentcompass.yaml"] if with_plugin else ["test_plain.py"]
    result = suite.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    said = result.stderr.str()
    for message in ("first finalizer failed", "second finalizer failed"):
        assert message in said, said
    assert said.count("PytestUnraisableExceptionWarning") >= 2, said


def test_nothing_stays_frozen_after_pytest_main(suite: pytest.Pytester) -> None:
    # Two sessions in one process, as a script calling pytest.main() twice would.
    suite.makeconftest("")
    script = suite.path / "twice.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc, sys
            import pytest

            for _ in range(2):
                code = pytest.main(["--agentcompass=agentcompass.yaml", "-q", "-p", "no:cacheprovider"])
                print("exit", int(code), "frozen", gc.get_freeze_count(), "thresholds", gc.get_threshold())
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=suite.path, capture_output=True, text=True, timeout=120, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("exit ")]
    assert lines == [f"exit 0 frozen 0 thresholds {gc.get_threshold()}"] * 2, done.stdout + done.stderr


def test_an_in_process_pytester_run_freezes_nothing(suite: pytest.Pytester) -> None:
    # pytester's inline runs tell pytest not to collect at all: the plugin does not either.
    suite.makeconftest("")
    before = gc.get_freeze_count()
    result = suite.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert gc.get_freeze_count() == before == 0
