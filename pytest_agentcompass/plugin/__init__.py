"""The pytest face: options, hook specs, and activation by ``--agentcompass``.

This module is the ``pytest11`` entry point. Nothing here runs unless
``--agentcompass`` (or the ``agentcompass_config`` ini key) is given: without
it the plugin only adds its options and declares its hooks.

The folder's modules, each with one job:

- ``keys``: the one ``StashKey`` holding the active :class:`~.run.AgentCompassRun`
  (and the names of what crosses between xdist's processes).
- ``run``: the active run: collection hooks, building requests, runtimes and the
  Orchestrator for every caller, and the summary.
- ``loop``: the replaced run loop without xdist (tasks on the Orchestrator).
- ``nodes``: collection nodes, config file -> request -> task item.
- ``outcomes``: a task outcome -> setup/call/teardown reports.
- ``single``: a task item run by pytest's own protocol (another plugin's loop).
- ``xdist``: which side of pytest-xdist (``-n``) this process registers:
  ``worker`` (the workers' concurrent loop), ``controller`` (the run's owner),
  ``interrupts`` (a Ctrl-C on the controller), ``wire`` (reports between them),
  ``scheduling`` (``--dist load`` with a deeper queue).
- ``fixtures``: session fixtures as component factories, and ``agentcompass_results``.
- ``progress``: the live status line.
- ``verdicts``: baselines and gates applied to the reports pytest makes.
- ``gate_items``: the per-request gate item.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from .keys import DEV_MODE, RUN_ID, run_key

__all__ = ["run_key"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agentcompass", "agent benchmarks as test sessions")
    group.addoption(
        "--agentcompass",
        dest="agentcompass",
        metavar="PATH",
        default=None,
        help="run the benchmarks of this agentcompass YAML config as tests",
    )
    group.addoption(
        "--agentcompass-carry-over",
        dest="agentcompass_carry_over",
        metavar="latest|RUN_DIR",
        default=None,
        help="carry over finished task results of an earlier run (every request)",
    )
    group.addoption(
        "--agentcompass-reuse",
        dest="agentcompass_reuse",
        metavar="latest|RUN_DIR",
        default=None,
        help="the old name of --agentcompass-carry-over (until 0.3.0)",
    )
    group.addoption(
        "--agentcompass-new-run",
        dest="agentcompass_new_run",
        action="store_true",
        default=False,
        help="start a new run directory instead of resuming an unfinished one",
    )
    group.addoption(
        "--agentcompass-concurrency",
        dest="agentcompass_concurrency",
        type=_task_concurrency,
        default=None,
        metavar="N",
        help="override task_concurrency of the config (at least 1)",
    )
    group.addoption(
        "--agentcompass-progress",
        dest="agentcompass_progress",
        choices=["auto", "tty", "lines", "off"],
        default="auto",
        help="live status while tasks run: redrawn on a TTY, periodic lines otherwise (default: auto)",
    )
    group.addoption(
        "--agentcompass-progress-interval",
        dest="agentcompass_progress_interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds between progress lines when not on a TTY (default: 30)",
    )
    group.addoption(
        "--agentcompass-baseline",
        dest="agentcompass_baseline",
        metavar="FILE|RUN_DIR",
        default=None,
        help="compare with a baseline: known failures xfail, regressions fail, improvements XPASS",
    )
    group.addoption(
        "--agentcompass-save-baseline",
        dest="agentcompass_save_baseline",
        metavar="FILE",
        default=None,
        help="after the run, write every task's outcome and score per request to FILE (to commit)",
    )
    group.addoption(
        "--agentcompass-html",
        dest="agentcompass_html",
        metavar="PATH",
        default=None,
        help="write one self-contained HTML report of the session to PATH",
    )
    group.addoption(
        "--agentcompass-properties",
        dest="agentcompass_properties",
        choices=["brief", "all"],
        default="brief",
        help="agentcompass.* properties of each item (junit <properties>): brief (default) has status, score "
        "and detail, and the others where they say something; all has every one on every item",
    )
    parser.addini("agentcompass_config", "agentcompass YAML config to run when --agentcompass is not given")


def _task_concurrency(value: str) -> int:
    """``--agentcompass-concurrency``: at least 1, as the config's ``task_concurrency``
    (0 or less meant no worker at all, and a run that waited forever)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    raw = config.getoption("agentcompass") or config.getini("agentcompass_config")
    if not raw:
        return
    # Imported here, not at module level: without the option nothing loads.
    from ..config import load_config
    from ..vocabulary.errors import ConfigError
    from .run import AgentCompassRun

    path = Path(raw)
    if not path.is_absolute():
        # The ini key is relative to the ini file; the option to where pytest was started.
        base = config.inipath.parent if not config.getoption("agentcompass") and config.inipath else Path.cwd()
        path = base / path
    if "::" in str(path.resolve()):
        # It would load, then pytest would split the collected path there and find no such file.
        raise pytest.UsageError(
            f"agentcompass config {path}: its path contains '::', which pytest reads as a node id separator;"
            " rename the file or folder"
        )
    try:
        loaded = load_config(path.resolve())
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    _warn_old_names(config, loaded.deprecations)
    run = AgentCompassRun(config, loaded)
    config.stash[run_key] = run
    run.register()
    if config.option.markers:
        run.declare_category_markers()
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # No paths given: run the config's tasks alone, not the tests under the rootdir.
        config.args = [str(loaded.path)]
    elif not any(Path(a.split("::")[0]).resolve() == loaded.path for a in config.args):
        config.args = [*config.args, str(loaded.path)]


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(run_key, None)
    if run is not None:
        run.unregister()
        del config.stash[run_key]
    # The local provider's reaper server (one per process, started on first use) is stopped
    # here rather than left to interpreter exit: its socket and process are closed and waited
    # for, not reported as leaked. Looked up, not imported: a run that never used it loads nothing.
    process = sys.modules.get("pytest_agentcompass.environments.process")
    if process is not None:
        process.shutdown_reaper(timeout=5.0)


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")
def pytest_configure_last_collection(config: pytest.Config) -> None:
    """pytest's garbage collections at the session's end stop once one finds nothing, and the
    interpreter's at the process's exit are skipped (``gc_tuning.skip_exit_collections``).

    pytest collects a fixed number of times (five) over the whole heap in a
    cleanup of ``_pytest/unraisableexception.py``, to report what finalizers
    raise; :func:`~pytest_agentcompass.runtime.gc_tuning.collect_until_clean`
    finds the same at a fraction of the cost. Put in that module's place for
    this session only, and put back by a cleanup that runs after pytest's:
    registered here, first of every plugin's ``pytest_configure``
    (``tryfirst``), before pytest's own. Nothing where the module is not what
    this was written against.
    """
    if not (config.getoption("agentcompass") or config.getini("agentcompass_config")):
        return
    from _pytest import unraisableexception

    from ..runtime.gc_tuning import collect_until_clean, skip_exit_collections

    if _owns_its_process(config):
        skip_exit_collections()
    original = getattr(unraisableexception, "gc_collect_harder", None)
    if not callable(original):
        return
    unraisableexception.gc_collect_harder = collect_until_clean
    config.add_cleanup(lambda: setattr(unraisableexception, "gc_collect_harder", original))


def _owns_its_process(config: pytest.Config) -> bool:
    """Whether the process ends with this session, and may skip its exit's collections: the ``pytest``
    command (or ``python -m pytest``) run with these very arguments, or an xdist worker of one
    (unless its controller runs under ``-X dev``). Not ``pytest.main()`` called by another program,
    nor an in-process pytester run inside a test session: their host goes on, and exits as it will.
    """
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        return not workerinput.get(DEV_MODE)
    if not sys.argv:
        return False
    program = Path(sys.argv[0])
    command = program.name.removesuffix(".exe") in ("pytest", "py.test") or program.parts[-2:] == (
        "pytest",
        "__main__.py",
    )
    return command and config.invocation_params.args == tuple(sys.argv[1:])


@pytest.hookimpl(trylast=True)
def pytest_agentcompass_make_run_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput and RUN_ID in workerinput:
        return str(workerinput[RUN_ID])
    from ..runtime.store.run_ids import new_run_id

    return new_run_id()


def _warn_old_names(config: pytest.Config, deprecations: Sequence[str]) -> None:
    """Warn once per session about options and config keys given under their old names (in
    the process that owns the run: an xdist worker reads the same command line and file)."""
    old = config.getoption("agentcompass_reuse")
    if old is not None:
        if config.getoption("agentcompass_carry_over") is not None:
            raise pytest.UsageError("give --agentcompass-carry-over only (--agentcompass-reuse is its old name)")
        config.option.agentcompass_carry_over = old
        deprecations = [
            "--agentcompass-reuse is now --agentcompass-carry-over (the same values); "
            "the old name stops working in 0.3.0",
            *deprecations,
        ]
    if hasattr(config, "workerinput"):
        return
    for message in deprecations:
        config.issue_config_time_warning(DeprecationWarning(message), stacklevel=2)
