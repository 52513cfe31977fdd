"""Turning collected requests into runtimes: run directories, stores, contexts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .runtime.context import RequestContext, request_fingerprint
from .limits import capacity_for
from .redact import Redactor
from .runtime.request import RequestRuntime, claim_run_dir, find_resumable_run, find_reusable_run
from .runtime.store import RunStore

if TYPE_CHECKING:
    from .components import RequestSetup
    from .nodes import TaskItem
    from .plugin import AgentCompassRun

__all__ = ["build_runtimes", "output_root"]


def output_root(run: AgentCompassRun) -> Path:
    root = Path(run.orchestration.output_dir)
    return root if root.is_absolute() else run.config.rootpath / root


def _runtime(run: AgentCompassRun, setup: RequestSetup, wanted: set[str], *, resume: bool) -> RequestRuntime:
    config = run.config
    req = setup.req
    fingerprint = request_fingerprint(req)
    request_dir = output_root(run) / req.name
    reuse_spec = config.getoption("agentcompass_reuse") or req.reuse
    resumable = None
    if resume and not reuse_spec and not config.getoption("agentcompass_new_run"):
        resumable = find_resumable_run(request_dir, fingerprint)
    run_dir = resumable or request_dir / run.run_id
    claim_run_dir(run_dir)
    reuse_dir = find_reusable_run(request_dir, reuse_spec, current=run_dir) if reuse_spec else None
    store = RunStore(run_dir, Redactor(run.loaded.secrets))
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
    )


def build_runtimes(run: AgentCompassRun, items: list[TaskItem]) -> list[RequestRuntime]:
    """One runtime per request that has selected items, in declaration order.

    :raises AgentCompassError: when ``reuse`` names nothing usable.
    """
    wanted: dict[str, set[str]] = {}
    for item in items:
        wanted.setdefault(item.request_name, set()).add(item.task.task_id)
    setups = sorted((s for s in run.setups.values() if s.req.name in wanted), key=lambda s: s.index)
    return [_runtime(run, setup, wanted[setup.req.name], resume=True) for setup in setups]


def single_task_runtime(run: AgentCompassRun, item: TaskItem) -> RequestRuntime:
    """A runtime for one task run under the standard protocol."""
    return _runtime(run, item.setup_info, {item.task.task_id}, resume=False)
