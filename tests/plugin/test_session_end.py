"""The end of a session: the plugin's shorter garbage collection changes nothing pytest reports.

pytest collects garbage five times over the whole heap when a session ends,
to report what finalizers raise; under ``--agentcompass`` it stops once a
collection finds nothing (``plugin/__init__.py``,
``pytest_configure_last_collection``). These tests hold that to pytest's
contract: a finalizer failing at the end is still reported, pytest's own
function is back once the session is over, and fewer collections run. Then
the interpreter's exit: every process of a run leaves its heap to the
operating system (``gc_tuning.skip_exit_collections``).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _pytest import unraisableexception

from pytest_agentcompass.runtime import gc_tuning

from conftest import tracing_request, write_config

# Garbage made at the end: a cycle whose finalizer raises and makes a second
# such cycle as it goes (garbage only after the first collection), once every
# other plugin is done; and a third from a cleanup registered mid-session.
# The conftest also counts the full collections that run after the hooks
# (pytest's), and prints them at exit.
CONFTEST = """
import atexit, gc, sys


class Failing:
    def __init__(self, message, then=None):
        self.me, self.message, self.then = self, message, then

    def __del__(self):
        if self.then:
            Failing(self.then)
        raise RuntimeError(self.message)


FULL = []


def count(phase, info):
    if phase == "start" and info["generation"] == 2:
        FULL.append(1)


def pytest_sessionstart(session):
    session.config.add_cleanup(lambda: Failing("third finalizer failed"))


def pytest_unconfigure(config):
    Failing("first finalizer failed", then="second finalizer failed")
    gc.callbacks.append(count)
    atexit.register(lambda: print("full collections at the end:", len(FULL), file=sys.stderr))
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
    for message in ("first finalizer failed", "second finalizer failed", "third finalizer failed"):
        assert message in said, said
    assert said.count("PytestUnraisableExceptionWarning") >= 3, said
    (counted,) = [line for line in said.splitlines() if line.startswith("full collections at the end:")]
    full = int(counted.rsplit(":", 1)[1])
    # pytest's five; with the plugin, until one finds nothing: the garbage above takes two or three.
    assert full < 5 if with_plugin else full == 5, said


def test_pytests_own_collection_is_back_after_pytest_main(suite: pytest.Pytester) -> None:
    # Two sessions in one process, as a script calling pytest.main() twice would.
    suite.makeconftest("")
    script = suite.path / "twice.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc
            import pytest
            from _pytest import unraisableexception

            original = unraisableexception.gc_collect_harder
            before = gc.get_threshold(), gc.get_freeze_count()
            for _ in range(2):
                code = pytest.main(["--agentcompass=agentcompass.yaml", "-q", "-p", "no:cacheprovider"])
                same = unraisableexception.gc_collect_harder is original
                after = gc.get_threshold(), gc.get_freeze_count()
                print("exit", int(code), "pytest's own", same, "gc as before", after == before)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=suite.path, capture_output=True, text=True, timeout=120, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("exit ")]
    assert lines == ["exit 0 pytest's own True gc as before True"] * 2, done.stdout + done.stderr


def test_an_in_process_pytester_run_leaves_pytest_as_it_was(suite: pytest.Pytester) -> None:
    # pytester's inline runs tell pytest not to collect at all: nothing is collected, and
    # pytest's function is back afterwards.
    suite.makeconftest("")
    original = unraisableexception.gc_collect_harder
    result = suite.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    assert unraisableexception.gc_collect_harder is original
    assert gc.get_freeze_count() == 0


# Registered when the conftest is imported, before the plugin's handler: runs after it, and says how
# many objects the collector no longer walks (frozen) as the interpreter goes on to exit.
AT_EXIT = """
import atexit, gc, os

ROLE = ["main"]


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        ROLE[0] = config.workerinput["workerid"]


def said():
    with open(os.path.join(os.path.dirname(__file__), f"exit-{ROLE[0]}.txt"), "w") as fh:
        fh.write(str(gc.get_freeze_count()))


atexit.register(said)
"""


@pytest.mark.parametrize("how", ["one process", "-n 2", "plain", "PYTHONDEVMODE", "-X dev -n 2", "pytest.main()"])
def test_the_interpreters_exit_walks_no_heap_left_from_the_session(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # What is alive at exit goes back with the process, in every process of a run (the pytest
    # command's, its workers'); not without the plugin, not in Python's development mode (whose exit
    # collection shows resource warnings), and not in another program that called pytest.main():
    # that program goes on.
    suite.makeconftest(AT_EXIT)
    suite.makepyfile(test_plain="def test_one():\n    pass\n")
    plugin = ["--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider"]
    if how == "pytest.main()":
        script = suite.path / "host.py"
        script.write_text(f"import sys, pytest\nsys.exit(pytest.main({plugin!r}))\n")
        done = subprocess.run([sys.executable, str(script)], cwd=suite.path, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    elif how == "-X dev -n 2":
        command = [sys.executable, "-X", "dev", "-m", "pytest", *plugin, "-n", "2"]
        done = subprocess.run(command, cwd=suite.path, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    else:
        if how == "PYTHONDEVMODE":
            monkeypatch.setenv("PYTHONDEVMODE", "1")
        args = {"one process": plugin, "-n 2": [*plugin, "-n", "2"], "plain": ["test_plain.py"]}.get(how, plugin)
        result = suite.runpytest_subprocess(*args)
        assert result.ret == 0, result.stdout.str()
    frozen = {path.stem: int(path.read_text()) for path in suite.path.glob("exit-*.txt")}
    workers = {"exit-gw0", "exit-gw1"} if "-n 2" in how else set()
    assert frozen.keys() == {"exit-main", *workers}
    if how in ("one process", "-n 2"):
        assert all(count > 10_000 for count in frozen.values()), frozen
    else:
        assert set(frozen.values()) == {0}, frozen


def test_an_in_process_run_leaves_its_hosts_exit_alone(suite: pytest.Pytester) -> None:
    # This test's own process is the host: nothing is registered for its exit.
    suite.makeconftest("")
    suite.runpytest_inprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider").assert_outcomes(passed=3)
    assert gc_tuning._skipping_at_exit is False
