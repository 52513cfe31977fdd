"""The active run of one pytest session: collection hooks, the replaced run loop, the summary.

One :class:`AgentCompassRun` exists per session with ``--agentcompass``. It is
kept under :data:`~.keys.run_key` from ``pytest_configure`` to
``pytest_unconfigure`` and is the only state the pytest face has: nodes,
fixtures and the xdist glue all reach it through that key.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..config import SAFE_NAME, LoadedConfig, RunRequest
from ..errors import AgentCompassError
from ..registry import Registry
from ..reports.gates import check_gate_names
from ..reports.terminal import write_terminal_summary
from ..runtime.assembly import RequestSetup, RunOptions, build_request, make_runtime
from ..runtime.collector import fewer_collections
from ..runtime.driver import drive
from ..runtime.logs import TaskLogHandler, route_task_output
from ..runtime.orchestrator import OrchestrationResult, Orchestrator
from ..runtime.request import RequestRuntime
from .gates import GateItem
from .nodes import ConfigFile, TaskItem
from .outcomes import emit_reports, redact_longrepr, redact_report
from .progress import Progress, say_line

if TYPE_CHECKING:
    from _pytest.reports import TestReport

    from ..runtime.task import TaskOutcome
    from .ci import CiRun
    from .xdist import DistributedRun

__all__ = ["AgentCompassRun"]

log = logging.getLogger("pytest_agentcompass")

#: Ordinary tests that ask for this fixture run after the tasks.
RESULTS_FIXTURE = "agentcompass_results"


class AgentCompassRun:
    """Per-session state and the hooks that only apply when the plugin is active."""

    def __init__(self, config: pytest.Config, loaded: LoadedConfig) -> None:
        self.config = config
        self.loaded = loaded
        self.registry = Registry(config.rootpath, loaded.directory)
        self.setups: dict[str, RequestSetup] = {}
        self.runtimes: list[RequestRuntime] = []
        self.items: list[TaskItem] = []
        self.result: OrchestrationResult | None = None
        self.run_id = self._make_run_id()
        self.distributed: DistributedRun | None = None
        self.ci: CiRun | None = None
        self._registered = False
        from ..redact import Redactor

        self.redactor = Redactor(loaded.secrets)

    def _make_run_id(self) -> str:
        hook = self.config.hook
        run_id = hook.pytest_agentcompass_make_session_id(config=self.config) or hook.pytest_agentcompass_make_run_id(
            config=self.config
        )
        # A folder name under output_dir: "../x" wrote outside it, "" into the request's folder itself.
        if not isinstance(run_id, str) or not SAFE_NAME.match(run_id):
            raise pytest.UsageError(
                f"pytest_agentcompass_make_run_id returned {run_id!r}; a run id is a folder name: "
                "letters, digits, '.', '_' and '-', starting with a letter or digit"
            )
        return run_id

    # -- life -----------------------------------------------------------------------
    def register(self) -> None:
        """Register this run's hooks (and the xdist glue when ``-n`` is in use)."""
        from . import fixtures
        from .ci import CiRun

        manager = self.config.pluginmanager
        manager.register(self, "agentcompass-run")
        manager.register(fixtures, "agentcompass-fixtures")
        # Before the xdist glue: its (trylast) sessionfinish then finalizes first.
        self.ci = CiRun(self)
        manager.register(self.ci, "agentcompass-ci")
        if manager.has_plugin("xdist") and (
            hasattr(self.config, "workerinput") or self.config.getoption("numprocesses", None)
        ):
            from .xdist import DistributedRun

            self.distributed = DistributedRun(self)
            manager.register(self.distributed, "agentcompass-distributed")

    def unregister(self) -> None:
        from ..limits import reset_limits

        reset_limits()
        # The summary is printed: release every outcome before pytest's final
        # full garbage collections walk the heap.
        for state in self.runtimes:
            state.outcomes.clear()
        for item in self.items:
            item.outcome = None
        self.runtimes = []
        self.items = []
        manager = self.config.pluginmanager
        for name in (
            "agentcompass-worker",
            "agentcompass-distributed",
            "agentcompass-ci",
            "agentcompass-fixtures",
            "agentcompass-run",
        ):
            plugin = manager.get_plugin(name)
            if plugin is not None:
                manager.unregister(plugin, name)

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        """A request's run directories are never collected, whatever ``output_dir`` is.

        Under a collected folder (``output_dir: tests/runs``), a ``test_*.py``
        an agent wrote into its logs or artifacts was collected on the next
        run and executed on the host.
        """
        if collection_path.name in self._request_names and collection_path.parent == self._output_root:
            return True
        return None

    @functools.cached_property
    def _request_names(self) -> frozenset[str]:
        return frozenset(req.name for req in self.orchestration.requests)

    @functools.cached_property
    def _output_root(self) -> Path:
        return Path(os.path.normpath(self.loaded.output_root))

    @property
    def orchestration(self) -> Any:
        return self.loaded.orchestration

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    def options(self) -> RunOptions:
        return RunOptions(
            run_id=self.run_id,
            redactor=self.redactor,
            config_dump=self.loaded.redacted_dump(),
            reuse=self.config.getoption("agentcompass_reuse"),
            new_run=self.config.getoption("agentcompass_new_run"),
            rerun_selected=bool(self.config.getoption("lf", False)),
        )

    # -- assembly ---------------------------------------------------------------------
    def build(self, index: int, req: RunRequest, node: pytest.Collector | None = None) -> RequestSetup:
        """Build request ``index`` once per process; ``node`` scopes hooks and fixtures."""
        if not self._registered:
            self._registered = True
            self.config.hook.pytest_agentcompass_register(registry=self.registry)
        ihook = node.ihook if node is not None else self.config.hook
        recipes = [r for batch in ihook.pytest_agentcompass_recipes(req=req) for r in batch or ()]
        resolver = None
        if node is not None:
            from .fixtures import fixture_resolver

            resolver = fixture_resolver(node)
        setup = build_request(index, req, self.registry, recipes, loaded=self.loaded, fixtures=resolver)
        check_gate_names(self.loaded, index, req, setup.benchmark)
        self.setups[req.name] = setup
        return setup

    def runtime(self, setup: RequestSetup, wanted: set[str], **kwargs: Any) -> RequestRuntime:
        return make_runtime(setup, self.loaded.output_root, self.options(), wanted, **kwargs)

    # -- one place for what every way of running a task shares ------------------------
    def task_finished(self, item: TaskItem, outcome: TaskOutcome) -> None:
        item.outcome = outcome
        item.ihook.pytest_agentcompass_task_finished(item=item, outcome=outcome)

    def request_finalized(self, state: RequestRuntime, details: Sequence[Mapping[str, Any]] | None = None) -> None:
        from ..reports.html import write_run_report

        if self.ci is not None:
            self.ci.gates.record(state)  # the verdict goes into summary.json, which the page shows
        try:
            write_run_report(state.store, self.ci.baseline if self.ci else None, details)
        except Exception as exc:  # the report is a view: never worth a result
            state.notes.append(f"report.html was not written: {type(exc).__name__}: {exc}")
        self.config.hook.pytest_agentcompass_request_finalized(request=state.name, summary=state.summary or {})

    def run_single(self, item: TaskItem) -> TaskOutcome:
        """Run one task in this process, under the standard protocol (an xdist worker)."""
        from .xdist import run_single_task

        outcome = run_single_task(self, item)
        self.task_finished(item, outcome)
        return outcome

    # -- collection --------------------------------------------------------------
    def pytest_collect_file(self, file_path: Any, parent: pytest.Collector) -> ConfigFile | None:
        if file_path.resolve() != self.loaded.path:
            return None
        return ConfigFile.for_path(parent, file_path)

    def pytest_report_header(self, config: pytest.Config) -> str:
        return f"agentcompass: {self.loaded.path} ({len(self.orchestration.requests)} request(s))"

    def declare_category_markers(self) -> None:
        """For ``--markers``, which never collects: load the tasks to list their categories."""
        from .nodes import register_category_markers

        for index, req in enumerate(self.orchestration.requests):
            try:
                setup = self.build(index, req)
            except Exception as exc:  # shown, not fatal: --markers still lists the rest
                self.config.issue_config_time_warning(
                    pytest.PytestWarning(f"agentcompass: request {req.name!r}: {exc}"), stacklevel=2
                )
                continue
            register_category_markers(self.config, setup.tasks)

    # -- running -------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if self.is_worker or self.config.pluginmanager.has_plugin("dsession"):
            return None  # xdist: workers run items one by one; the controller runs none
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(
                f"{session.testsfailed} error{'s' if session.testsfailed != 1 else ''} during collection"
            )
        if session.config.option.collectonly:
            return True
        tasks = [i for i in session.items if isinstance(i, TaskItem)]
        # Gate items judge finalized requests: they run after every task.
        gates = [i for i in session.items if isinstance(i, GateItem)]
        others = [i for i in session.items if not isinstance(i, TaskItem | GateItem)]
        before = [i for i in others if RESULTS_FIXTURE not in getattr(i, "fixturenames", ())]
        after = [i for i in others if RESULTS_FIXTURE in getattr(i, "fixturenames", ())]
        # Session fixtures stay up across the tasks (components may come from them).
        self._run_items(session, before, next(iter(tasks or gates or after), None))
        if tasks:
            self._run_tasks(session, tasks)
            _check_stop(session)
        self._run_items(session, gates, after[0] if after else None)
        self._run_items(session, after, None)
        if not after:
            session._setupstate.teardown_exact(None)
        return True

    @staticmethod
    def _run_items(session: pytest.Session, items: Sequence[pytest.Item], last_next: pytest.Item | None) -> None:
        for index, item in enumerate(items):
            nextitem = items[index + 1] if index + 1 < len(items) else last_next
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            _check_stop(session)

    def _run_tasks(self, session: pytest.Session, items: list[TaskItem]) -> None:
        by_key = {(i.request_name, i.task.task_id): i for i in items}
        self.items = items
        try:
            self.runtimes = self._build_runtimes(items)
        except AgentCompassError as exc:
            raise self.usage_error(exc) from None
        orchestration = self.orchestration
        thresholds = {r.name: r.ctx.req.execution.pass_threshold for r in self.runtimes}
        orchestrator: Orchestrator

        def on_outcome(outcome: TaskOutcome) -> None:
            item = by_key.get((outcome.request, outcome.task.task_id))
            if item is None:
                return
            progress.clear()
            self.task_finished(item, outcome)
            emit_reports(item, outcome, thresholds[outcome.request])
            if session.shouldfail or session.shouldstop:
                orchestrator.stop(str(session.shouldfail or session.shouldstop))

        def on_event(event: str, state: RequestRuntime) -> None:
            if event == "finalized":
                self.request_finalized(state)
            elif event == "prepared" and state.resumed:
                progress.clear()
                done = f"{state.resumed_done} of {len(state.wanted)} tasks done"
                self.say(f"agentcompass: {state.name}: resuming {state.store.run_dir} ({done})")

        progress = self._progress()
        for state in self.runtimes:
            state.ctx.events.on_retry = progress.on_retry
        providers = {state.ctx.req.environment.id: state.ctx.capacity for state in self.runtimes}

        def on_tick() -> None:
            # "path/to/file.py:Class" ids are long: the class name is enough on one line.
            permits = {
                name.rsplit(":", 1)[-1] + (f" {p.in_use}/{p.limit}" if p.limit else f" {p.in_use}"): p.in_use
                for name, p in providers.items()
            }
            progress.tick(self.runtimes, permits)

        orchestrator = Orchestrator(
            self.runtimes,
            task_concurrency=self.config.getoption("agentcompass_concurrency") or orchestration.task_concurrency,
            timeout_seconds=orchestration.timeout_seconds,
            cleanup_grace_seconds=orchestration.cleanup_grace_seconds,
            on_outcome=on_outcome,
            on_event=on_event,
            on_tick=on_tick if progress.enabled else None,
            tick_seconds=min(progress.interval, 1.0),
        )
        handler = TaskLogHandler()
        root = logging.getLogger()
        level = self.config.getoption("log_level", None) or self.config.getini("log_level")
        previous_level = root.level
        if level:
            root.setLevel(level.upper() if isinstance(level, str) else level)
        root.addHandler(handler)
        try:
            with route_task_output(), fewer_collections():
                self.result = drive(orchestrator)
        finally:
            root.removeHandler(handler)
            root.setLevel(previous_level)
            progress.clear()
            for state in self.runtimes:
                state.store.close()
        if self.result.status == "interrupted":
            raise KeyboardInterrupt

    def _build_runtimes(self, items: list[TaskItem]) -> list[RequestRuntime]:
        """One runtime per request that has selected items, in declaration order."""
        wanted: dict[str, dict[str, int]] = {}
        for position, item in enumerate(items):
            wanted.setdefault(item.request_name, {})[item.task.task_id] = position
        setups = sorted((s for s in self.setups.values() if s.req.name in wanted), key=lambda s: s.index)
        return [
            self.runtime(setup, set(wanted[setup.req.name]), resume=True, order=wanted[setup.req.name])
            for setup in setups
        ]

    def say(self, line: str) -> None:
        """A line on the terminal while tasks run, even under ``-q``."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            say_line(terminal, line)

    def _progress(self) -> Progress:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        mode = self.config.getoption("agentcompass_progress")
        if terminal is None or self.config.get_verbosity() < 0:
            mode = "off"
        return Progress(terminal, mode, self.config.getoption("agentcompass_progress_interval"))

    # -- reports ---------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        # Every report of the session, tasks or not: a secret a task logged can surface anywhere.
        report: TestReport = yield
        redact_report(report, item, self.redactor)
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # Before the terminal and junit keep it: a component id or a task loader's error may hold a ${VAR} value.
        redact_longrepr(report, self.redactor)

    def usage_error(self, exc: Exception) -> pytest.UsageError:
        """The error pytest prints for ``exc`` (a broken run directory, a claimed run), secrets masked."""
        return pytest.UsageError(self.redactor.text(str(exc)))

    # -- summary -------------------------------------------------------------------------
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write_terminal_summary(
            terminalreporter,
            self.runtimes,
            self.result,
            self.ci.summary_lines if self.ci else None,
            mask=self.redactor.text,
        )


def _check_stop(session: pytest.Session) -> None:
    if session.shouldfail:
        raise session.Failed(session.shouldfail)
    if session.shouldstop:
        raise session.Interrupted(session.shouldstop)
