"""The active run of one pytest session: collection hooks, the replaced run loop, the summary."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .config import LoadedConfig
from .errors import AgentCompassError
from .limits import capacity_for
from .nodes import ConfigFile, TaskItem
from .progress import Progress
from .redact import Redactor
from .registry import Registry
from .reporting import emit_reports
from .runtime.context import RequestContext, request_fingerprint
from .runtime.logs import TaskLogHandler
from .runtime.orchestrator import OrchestrationResult, Orchestrator
from .runtime.request import RequestRuntime, claim_run_dir, find_resumable_run, find_reusable_run
from .runtime.store import RunStore
from .runtime.threads import BlockingCallPool, workers_for

if TYPE_CHECKING:
    from .components import RequestSetup
    from .runtime.task import TaskOutcome

__all__ = ["AgentCompassRun", "build_runtimes", "drive", "make_runtime", "output_root"]

log = logging.getLogger("pytest_agentcompass")


class AgentCompassRun:
    """Per-session state and the hooks that only apply when the plugin is active."""

    def __init__(self, config: pytest.Config, loaded: LoadedConfig) -> None:
        self.config = config
        self.loaded = loaded
        self.registry = Registry(config.rootpath)
        self.setups: dict[str, RequestSetup] = {}
        self.runtimes: list[RequestRuntime] = []
        self._items: list[TaskItem] = []
        self.result: OrchestrationResult | None = None
        self.run_id: str = config.hook.pytest_agentcompass_make_session_id(config=config) or ""
        self._registered = False
        if config.pluginmanager.has_plugin("xdist") and (
            hasattr(config, "workerinput") or config.getoption("numprocesses", None)
        ):
            from .distributed import DistributedRun

            config.pluginmanager.register(DistributedRun(self), "agentcompass-distributed")

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
        by_key = {(i.request_name, i.task.task_id): i for i in items}
        self._items = items
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
            progress.clear()
            item.ihook.pytest_agentcompass_task_finished(item=item, outcome=outcome)
            emit_reports(item, outcome, thresholds[outcome.request])
            if session.shouldfail or session.shouldstop:
                orchestrator.stop(str(session.shouldfail or session.shouldstop))

        def on_event(event: str, state: RequestRuntime) -> None:
            if event == "finalized":
                summary = {"metrics": state.metrics, "counts": state.counts()}
                self.config.hook.pytest_agentcompass_request_finalized(request=state.name, summary=summary)

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
        # Every finished task leaves long-lived objects (outcomes, reports); with
        # the default thresholds that triggers a full collection every few
        # hundred tasks over an ever larger heap. Young generations still run.
        gc_thresholds = gc.get_threshold()
        gc.set_threshold(gc_thresholds[0], gc_thresholds[1], max(gc_thresholds[2], 100))
        try:
            self.result = drive(orchestrator)
        finally:
            gc.set_threshold(*gc_thresholds)
            root.removeHandler(handler)
            root.setLevel(previous_level)
            progress.clear()
            for state in self.runtimes:
                state.store.close()
        if self.result.status == "cancelled":
            raise KeyboardInterrupt

    def _progress(self) -> Progress:
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        mode = self.config.getoption("agentcompass_progress")
        if terminal is None or self.config.get_verbosity() < 0:
            mode = "off"
        return Progress(terminal, mode, self.config.getoption("agentcompass_progress_interval"))

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
        if self.result and self.result.abandoned_calls:
            calls = self.result.abandoned_calls
            tr.write_line(
                f"{len(calls)} blocking call(s) still running after the cleanup grace were abandoned "
                f"(daemon threads, they end with the process): {', '.join(calls)}",
                yellow=True,
            )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        from .limits import reset_limits

        reset_limits()
        # The summary is printed: release every outcome before pytest's final
        # full garbage collections walk the heap.
        for state in self.runtimes:
            state.outcomes.clear()
        for item in self._items:
            item.outcome = None
        self.runtimes = []
        self._items = []


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def output_root(run: AgentCompassRun) -> Path:
    root = Path(run.orchestration.output_dir)
    return root if root.is_absolute() else run.config.rootpath / root


def make_runtime(
    run: AgentCompassRun, setup: RequestSetup, wanted: set[str], *, resume: bool, order: dict[str, int] | None = None
) -> RequestRuntime:
    """The runtime of one request: its run directory (new, resumed or shared), store and context."""
    config = run.config
    req = setup.req
    fingerprint = request_fingerprint(req)
    request_dir = output_root(run) / req.name
    reuse_spec = config.getoption("agentcompass_reuse") or req.reuse
    resumable = None
    if resume and not reuse_spec and not config.getoption("agentcompass_new_run"):
        resumable = find_resumable_run(request_dir, fingerprint)
    run_dir = resumable or request_dir / run.run_id
    claim_run_dir(run_dir, req.name, fingerprint)
    reuse_dir = find_reusable_run(request_dir, reuse_spec, current=run_dir) if reuse_spec else None
    store = RunStore(run_dir, Redactor(run.loaded.secrets))
    for component in (setup.benchmark, setup.harness, setup.provider):
        if component is not None:
            component.run_dir = run_dir
    ctx = RequestContext(
        req=req,
        benchmark=setup.benchmark,
        harness=setup.harness,
        provider=setup.provider,
        planner=setup.planner(),
        strategy=setup.strategy,
        store=store,
        capacity=capacity_for(req.environment.id, req.environment.capacity),
        run_id=run_dir.name,
        fingerprint=fingerprint,
        analyzers=setup.analyzers,
    )
    rerun = wanted if config.getoption("lf", False) else set()
    return RequestRuntime(
        ctx,
        setup.tasks,
        wanted,
        config_dump=run.loaded.redacted_dump(),
        reuse_dir=reuse_dir,
        resumed=resumable is not None,
        rerun=rerun,
        order=order,
    )


def build_runtimes(run: AgentCompassRun, items: list[TaskItem]) -> list[RequestRuntime]:
    """One runtime per request that has selected items, in declaration order.

    :raises AgentCompassError: when ``reuse`` names nothing usable.
    """
    wanted: dict[str, dict[str, int]] = {}
    for position, item in enumerate(items):
        wanted.setdefault(item.request_name, {})[item.task.task_id] = position
    setups = sorted((s for s in run.setups.values() if s.req.name in wanted), key=lambda s: s.index)
    return [
        make_runtime(run, setup, set(wanted[setup.req.name]), resume=True, order=wanted[setup.req.name])
        for setup in setups
    ]


def drive(orchestrator: Orchestrator) -> OrchestrationResult:
    """Run ``orchestrator`` on a new event loop with two-stage Ctrl-C handling.

    The first SIGINT cancels the orchestration cooperatively (cleanup within
    the grace period); a second one raises ``KeyboardInterrupt`` at once.
    """
    loop = asyncio.new_event_loop()
    pool = BlockingCallPool(workers_for(orchestrator.task_concurrency), grace=orchestrator.cleanup_grace_seconds)
    loop.set_default_executor(pool)
    main = loop.create_task(orchestrator.execute())
    interrupts = 0

    def on_sigint() -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            sys.stderr.write("\nagentcompass: interrupted, cleaning up (press Ctrl-C again to exit at once)\n")
            main.cancel()
        else:
            raise KeyboardInterrupt

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if in_main_thread else None
    if in_main_thread:
        # Through the loop, not signal.signal: the loop's wakeup fd is written
        # from the C handler, so the loop wakes even when the kernel delivered
        # SIGINT to a worker thread while the main thread sat in epoll_wait.
        loop.add_signal_handler(signal.SIGINT, on_sigint)
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
            loop.remove_signal_handler(signal.SIGINT)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if not forced:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            started = orchestrator.result.cleanup_started
            spent = 0.0 if started is None else time.monotonic() - started
            # One grace for everything cancellation waits on: async tasks first, then threads.
            pool.shutdown(wait=True, cancel_futures=True, timeout=max(0.0, pool.grace - spent))
            orchestrator.result.abandoned_calls = pool.abandoned
            if pool.abandoned:
                log.warning("blocking calls still running after the cleanup grace: %s", ", ".join(pool.abandoned))
    return orchestrator.result
