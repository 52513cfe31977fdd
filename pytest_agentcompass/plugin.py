"""The pytest face: options, collection of the config file, the replaced run loop.

Nothing here runs unless ``--agentcompass`` (or the ``agentcompass_config``
ini key) is given: without it the plugin only adds its options.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .config import LoadedConfig, load_config
from .errors import AgentCompassError, ConfigError
from .nodes import ConfigFile, TaskItem
from .registry import Registry
from .reporting import emit_reports

if TYPE_CHECKING:
    from .components import RequestSetup
    from .runtime.orchestrator import OrchestrationResult, Orchestrator
    from .runtime.request import RequestRuntime
    from .runtime.task import TaskOutcome

__all__ = ["AgentCompassRun", "run_key"]

#: The active run of this pytest session, if ``--agentcompass`` was given.
run_key = pytest.StashKey["AgentCompassRun"]()

log = logging.getLogger("pytest_agentcompass")


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
        "--agentcompass-reuse",
        dest="agentcompass_reuse",
        metavar="latest|RUN_DIR",
        default=None,
        help="reuse finished task results of an earlier run (every request)",
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
        type=int,
        default=None,
        metavar="N",
        help="override task_concurrency of the config",
    )
    parser.addini("agentcompass_config", "agentcompass YAML config to run when --agentcompass is not given")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    raw = config.getoption("agentcompass") or config.getini("agentcompass_config")
    if not raw:
        return
    path = Path(raw)
    if not path.is_absolute():
        # The ini key is relative to the ini file; the option to where pytest was started.
        base = config.inipath.parent if not config.getoption("agentcompass") and config.inipath else Path.cwd()
        path = base / path
    try:
        loaded = load_config(path.resolve())
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    run = AgentCompassRun(config, loaded)
    config.stash[run_key] = run
    config.pluginmanager.register(run, "agentcompass-run")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # No paths given: run the config's tasks alone, not the tests under the rootdir.
        config.args = [str(loaded.path)]
    elif not any(Path(a.split("::")[0]).resolve() == loaded.path for a in config.args):
        config.args = [*config.args, str(loaded.path)]


class AgentCompassRun:
    """Per-session state and the hooks that only apply when the plugin is active."""

    def __init__(self, config: pytest.Config, loaded: LoadedConfig) -> None:
        self.config = config
        self.loaded = loaded
        self.registry = Registry(config.rootpath)
        self.setups: dict[str, RequestSetup] = {}
        self.runtimes: list[RequestRuntime] = []
        self.result: OrchestrationResult | None = None
        self.run_id = ""
        self._registered = False

    @property
    def orchestration(self) -> Any:
        return self.loaded.orchestration

    def ensure_registered(self) -> None:
        if not self._registered:
            self._registered = True
            self.config.hook.pytest_agentcompass_register(registry=self.registry)

    # -- collection --------------------------------------------------------------
    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> ConfigFile | None:
        if file_path.resolve() != self.loaded.path:
            return None
        self.ensure_registered()
        node = ConfigFile.from_parent(parent, path=file_path)
        node.run = self
        return node

    def pytest_report_header(self, config: pytest.Config) -> str:
        return f"agentcompass: {self.loaded.path} ({len(self.orchestration.requests)} request(s))"

    # -- running -------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if hasattr(self.config, "workerinput") or self.config.pluginmanager.has_plugin("dsession"):
            return None  # xdist: workers run items one by one; the controller runs none
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(
                f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} during collection"
            )
        if session.config.option.collectonly:
            return True
        others = [i for i in session.items if not isinstance(i, TaskItem)]
        for index, item in enumerate(others):
            nextitem = others[index + 1] if index + 1 < len(others) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        tasks = [i for i in session.items if isinstance(i, TaskItem)]
        if tasks:
            self._run_tasks(session, tasks)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        return True

    def _run_tasks(self, session: pytest.Session, items: list[TaskItem]) -> None:
        from .runtime.orchestrator import Orchestrator
        from .session import build_runtimes

        by_key = {(i.request_name, i.task.task_id): i for i in items}
        self.run_id = self.config.hook.pytest_agentcompass_make_session_id(config=self.config) or ""
        try:
            self.runtimes = build_runtimes(self, items)
        except AgentCompassError as exc:
            raise pytest.UsageError(str(exc)) from None
        orchestration = self.orchestration
        thresholds = {r.name: r.ctx.req.execution.pass_threshold for r in self.runtimes}
        orchestrator: Orchestrator

        def on_outcome(outcome: TaskOutcome) -> None:
            item = by_key.get((outcome.request, outcome.task.task_id))
            if item is None:
                return
            item.outcome = outcome
            item.ihook.pytest_agentcompass_task_finished(item=item, outcome=outcome)
            emit_reports(item, outcome, thresholds[outcome.request])
            if session.shouldfail or session.shouldstop:
                orchestrator.stop(str(session.shouldfail or session.shouldstop))

        def on_event(event: str, state: RequestRuntime) -> None:
            if event == "finalized":
                summary = {"metrics": state.metrics, "counts": state.counts()}
                self.config.hook.pytest_agentcompass_request_finalized(request=state.name, summary=summary)

        orchestrator = Orchestrator(
            self.runtimes,
            task_concurrency=self.config.getoption("agentcompass_concurrency") or orchestration.task_concurrency,
            timeout_seconds=orchestration.timeout_seconds,
            cleanup_grace_seconds=orchestration.cleanup_grace_seconds,
            on_outcome=on_outcome,
            on_event=on_event,
        )
        try:
            self.result = drive(orchestrator)
        finally:
            for state in self.runtimes:
                state.store.close()
        if self.result.status == "cancelled":
            raise KeyboardInterrupt

    # -- summary -------------------------------------------------------------------------
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.runtimes:
            return
        tr = terminalreporter
        tr.section("agentcompass")
        for state in self.runtimes:
            counts = state.counts()
            line = (
                f"{state.name}: {counts['tasks']} tasks, {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['errors']} errors"
            )
            if counts["reused"]:
                line += f", {counts['reused']} reused"
            if counts["retries"]:
                line += f", {counts['retries']} retries"
            tr.write_line(line)
            if state.failed:
                tr.write_line(f"  {state.failed}")
            if state.metrics:
                shown = ", ".join(f"{k}={_fmt(v)}" for k, v in state.metrics.items())
                tr.write_line(f"  metrics: {shown}")
            for note in state.notes:
                tr.write_line(f"  note: {note}")
            tr.write_line(f"  run directory: {state.store.run_dir}")
        kept = [
            (state.name, outcome.task.task_id, env)
            for state in self.runtimes
            for outcome in state.outcomes.values()
            if not outcome.reused
            for env in outcome.kept_environments
        ]
        if kept:
            tr.write_line("kept environments (keep_environment: true); remove them when done:")
            for name, task_id, env in kept:
                tr.write_line(f"  {name}::{task_id}: {env}")
        if self.result and self.result.status in ("timeout", "cancelled"):
            tr.write_line(f"orchestration {self.result.status}: {self.result.reason}", red=True)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from .limits import reset_limits

        reset_limits()


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def pytest_agentcompass_make_session_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput and "agentcompass_run_id" in workerinput:
        return str(workerinput["agentcompass_run_id"])
    from .runtime.store import new_run_id

    return new_run_id()


def drive(orchestrator: Orchestrator) -> OrchestrationResult:
    """Run ``orchestrator`` on a new event loop with two-stage Ctrl-C handling.

    The first SIGINT cancels the orchestration cooperatively (cleanup within
    the grace period); a second one raises ``KeyboardInterrupt`` at once.
    """
    loop = asyncio.new_event_loop()
    main = loop.create_task(orchestrator.execute())
    interrupts = 0

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            sys.stderr.write("\nagentcompass: interrupted, cleaning up (press Ctrl-C again to exit at once)\n")
            loop.call_soon_threadsafe(main.cancel)
        else:
            raise KeyboardInterrupt

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if in_main_thread else None
    forced = False
    try:
        try:
            loop.run_until_complete(main)
        except asyncio.CancelledError:
            pass
        except KeyboardInterrupt:
            forced = True
            raise
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
        if not forced:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
    return orchestrator.result


def run_single_task(item: TaskItem) -> TaskOutcome:
    """Run one task outside the concurrent loop (the standard protocol under xdist)."""
    from .session import single_task_runtime

    run: AgentCompassRun = item.config.stash[run_key]
    state = single_task_runtime(run, item)
    from .runtime.orchestrator import Orchestrator

    outcomes: list[TaskOutcome] = []
    orchestrator = Orchestrator(
        [state],
        task_concurrency=1,
        timeout_seconds=None,
        cleanup_grace_seconds=run.orchestration.cleanup_grace_seconds,
        on_outcome=outcomes.append,
    )
    drive(orchestrator)
    state.store.close()
    return outcomes[-1] if outcomes else state.cancelled_outcome(item.task, "not run")

