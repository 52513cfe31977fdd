"""The active run of one pytest session: collection, what every way of running tasks shares, the summary.

One :class:`AgentCompassRun` exists per session with ``--agentcompass``. It is
kept under :data:`~.keys.run_key` from ``pytest_configure`` to
``pytest_unconfigure`` and is the only state the pytest face has: nodes,
fixtures, the run loop and the xdist glue all reach it through that key. The
three callers of the runtime (the loop without xdist in ``loop``, an xdist
worker's in ``worker``, the xdist controller in ``controller``) build their
request runtimes and their Orchestrator here, so the settings apply the same
way in each.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..config import SAFE_NAME, LoadedConfig, RunRequest
from ..runtime.assembly import RequestSetup, RunOptions, build_request
from ..runtime.registry import Registry
from .nodes import ConfigFile, TaskItem
from .outcomes import redact_longrepr, redact_report
from .progress import say_line

# What runs the tasks (the Orchestrator, the request runtimes and the run store beneath them, the
# terminal summary) is imported where it is first used: configuration and collection need none of
# it, so ``--collect-only`` and a config that fails to load do not pay for it.
if TYPE_CHECKING:
    from _pytest.reports import TestReport

    from ..runtime.orchestrator import OrchestrationResult, Orchestrator
    from ..runtime.request import RequestRuntime
    from ..runtime.summary import RequestSummary
    from ..vocabulary.outcome import TaskOutcome
    from .verdicts import Verdicts

__all__ = ["AgentCompassRun"]

log = logging.getLogger("pytest_agentcompass")


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
        self.verdicts: Verdicts | None = None
        self._registered = False
        self._classnames: dict[str, str] = {}
        #: What the terminal summary prints of each request, once the outcomes are released.
        self._printed: list[tuple[RequestSummary, list[str]]] | None = None
        from ..vocabulary.redact import Redactor

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
        from .verdicts import Verdicts

        manager = self.config.pluginmanager
        manager.register(self, "agentcompass-run")
        manager.register(fixtures, "agentcompass-fixtures")
        # Before the xdist glue: its (trylast) sessionfinish then finalizes first.
        self.verdicts = Verdicts(self)
        manager.register(self.verdicts, "agentcompass-verdicts")
        if not hasattr(self.config, "workerinput"):
            from .loop import InProcessLoop

            manager.register(InProcessLoop(self), "agentcompass-loop")
        if manager.has_plugin("xdist") and (
            hasattr(self.config, "workerinput") or self.config.getoption("numprocesses", None)
        ):
            from .xdist import register_side

            register_side(self)

    def release_outcomes(self) -> None:
        """Every item has run: compute what the terminal summary prints, then release the outcomes.

        Before junit builds its whole file in memory at session finish: the memory of 10,000
        outcomes is then there to reuse, not added to the run's peak (issue 27).
        """
        verdicts = self.verdicts
        self._printed = [
            (state.final_summary(), verdicts.summary_lines(state) if verdicts is not None else [])
            for state in self.runtimes
        ]
        for state in self.runtimes:
            state.forget_outcomes()
        for item in self.items:
            item.outcome = None

    def unregister(self) -> None:
        from ..concurrency.limits import reset_limits

        reset_limits()
        # The summary is printed: release every outcome before pytest's final
        # full garbage collections walk the heap.
        for state in self.runtimes:
            state.forget_outcomes()
        for item in self.items:
            item.outcome = None
        self.runtimes = []
        self.items = []
        manager = self.config.pluginmanager
        from .xdist import PLUGIN_NAMES

        for name in (
            *PLUGIN_NAMES,
            "agentcompass-loop",
            "agentcompass-verdicts",
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
            carry_over=self.config.getoption("agentcompass_carry_over"),
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
        self.setups[req.name] = setup
        return setup

    @property
    def task_concurrency(self) -> int:
        return int(self.config.getoption("agentcompass_concurrency") or self.orchestration.task_concurrency)

    def own_runtime(
        self, setup: RequestSetup, wanted: set[str], *, resume: bool = True, order: dict[str, int] | None = None
    ) -> RequestRuntime:
        from ..runtime.runtimes import own_runtime

        return own_runtime(setup, self.loaded.output_root, self.options(), wanted, resume=resume, order=order)

    def shared_runtime(self, setup: RequestSetup, run_dir: Path | None) -> RequestRuntime:
        from ..runtime.runtimes import shared_runtime

        return shared_runtime(setup, self.loaded.output_root, self.options(), run_dir)

    # -- what in-process and xdist workers run tasks with ------------------------------
    def orchestrator(self, states: Sequence[RequestRuntime], *, fed: bool = False, **observers: Any) -> Orchestrator:
        from ..concurrency.limits import task_slots
        from ..runtime.orchestrator import Orchestrator

        concurrency = self.task_concurrency
        return Orchestrator(
            states,
            task_concurrency=concurrency,
            timeout_seconds=self.orchestration.timeout_seconds,
            cleanup_grace_seconds=self.orchestration.cleanup_grace_seconds,
            fed=fed,
            # Run-wide permits when several processes run the tasks (xdist); none in process.
            slots=task_slots(concurrency),
            **observers,
        )

    @contextlib.contextmanager
    def task_output(self) -> Iterator[None]:
        from ..runtime.logs import capture_task_output

        level = self.config.getoption("log_level", None) or self.config.getini("log_level")
        with capture_task_output(level or None):
            yield

    # -- one place for what every way of running a task shares ------------------------
    def task_finished(self, item: TaskItem, outcome: TaskOutcome) -> None:
        item.outcome = outcome
        item.ihook.pytest_agentcompass_task_finished(item=item, outcome=outcome)

    def request_finalized(self, state: RequestRuntime) -> None:
        from ..reports.html import write_run_report

        if self.verdicts is not None:
            self.verdicts.gates.record(state)  # the verdict goes into summary.json, which the page shows
        try:
            write_run_report(state.store, self.verdicts.baseline if self.verdicts else None)
        except Exception as exc:  # the report is a view: never worth a result
            state.note(f"report.html was not written: {type(exc).__name__}: {exc}")
        state.store.forget_page_records()  # the page is written: what it showed need not stay in memory
        self.config.hook.pytest_agentcompass_request_finalized(request=state.name, summary=state.summary or {})

    def run_single(self, item: TaskItem) -> TaskOutcome:
        """Run one task in this process, under pytest's standard protocol (docs/how-it-works.md, "Three ways")."""
        from .single import run_single_task

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

    def say(self, line: str) -> None:
        """A line on the terminal while tasks run, even under ``-q``."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            say_line(terminal, line)

    def say_resuming(self, state: RequestRuntime) -> None:
        if state.resumed and state.failed is None:
            done = f"{state.resumed_total} of {len(state.tasks)} tasks done"
            if len(state.wanted) < len(state.tasks):  # -k, --lf: what this session asked for, too
                done += f"; {state.resumed_done} of the {len(state.wanted)} selected"
            self.say(f"agentcompass: {state.name}: resuming {state.store.run_dir} ({done})")

    # -- reports ---------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """junit's classname of a task or gate item: ``<config file name>.<request>``.

        pytest derives it from the node id's path: relative to the rootdir
        (another rootdir, another classname) or, for a config outside it,
        absolute (``.home.me.suite.agentcompass.yaml.r``, a leading dot).
        Set before junit records the report, it is kept as a user attribute.
        """
        xml = self._junit
        if xml is None:
            return
        parts = report.nodeid.split("::")
        if len(parts) != 3 or os.path.basename(parts[0]) != self.loaded.path.name:
            return
        # One string per request, not one per report: junit keeps every testcase's attributes to the end.
        classname = self._classnames.get(parts[1])
        if classname is None:
            classname = f"{self.loaded.path.name}.{parts[1]}"
            classname = self._classnames[parts[1]] = f"{xml.prefix}.{classname}" if xml.prefix else classname
        xml.node_reporter(report).attrs["classname"] = classname

    @functools.cached_property
    def _junit(self) -> Any:
        """pytest's junit writer of this session (``--junitxml``), or None."""
        from _pytest.junitxml import xml_key

        return self.config.stash.get(xml_key, None)

    @pytest.hookimpl(trylast=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """pytest's banner names the exception's class; a SIGTERM is said in words (after the
        terminal reporter kept its text, which is what it prints at the end)."""
        driver = sys.modules.get("pytest_agentcompass.runtime.driver")  # not loaded: no SIGTERM of ours
        if driver is None or not isinstance(excinfo.value, driver.Terminated):
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        memo = getattr(reporter, "_keyboardinterrupt_memo", None)
        crash = getattr(memo, "reprcrash", None)
        if crash is not None:
            crash.message = "SIGTERM arrived: the run stopped and was recorded as interrupted"

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
        from ..reports.terminal import write_terminal_summary

        by_name = {state.name: state for state in self.runtimes}
        verdicts = self.verdicts
        printed = self._printed
        if printed is None:  # the outcomes are still here (xdist, an interrupted loop)
            printed = [
                (state.final_summary(), verdicts.summary_lines(state) if verdicts is not None else [])
                for state in by_name.values()
            ]
        lines = {summary.name: extra for summary, extra in printed}

        def extra(summary: RequestSummary) -> list[str]:
            return lines[summary.name]

        write_terminal_summary(
            terminalreporter,
            [summary for summary, _ in printed],
            self.result,
            extra,
            mask=self.redactor.text,
        )
