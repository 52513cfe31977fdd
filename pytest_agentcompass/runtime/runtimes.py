"""A request's runtime, built when its tasks are about to run: the run directory claimed or joined,
the store, the context every stage reads.

Apart from :mod:`.assembly` (components and tasks, which collection needs) so that configuring and
collecting do not import the run's machinery (ownership, the store, the request's life).
"""

from __future__ import annotations

from pathlib import Path

from ..concurrency.limits import capacity_for
from .assembly import RequestSetup, RunOptions
from .context import RequestContext, request_fingerprint
from .ownership import RunRole, claim, join
from .request import RequestRuntime
from .store import RunStore

__all__ = ["own_runtime", "shared_runtime"]


def own_runtime(
    setup: RequestSetup,
    output_root: Path,
    options: RunOptions,
    wanted: set[str],
    *,
    resume: bool = True,
    order: dict[str, int] | None = None,
) -> RequestRuntime:
    """The runtime of a request whose run directory this process owns: resumed, carried over into, or new.

    :param resume: Continue the newest unfinished run with the same settings, if there is one.
    :raises AgentCompassError: when ``carry_over`` names nothing usable or the run is held by another process.
    """
    req = setup.req
    fingerprint = request_fingerprint(req)
    role, run_dir = claim(
        output_root / req.name,
        options.run_id,
        req.name,
        fingerprint,
        resume=resume,
        new_run=options.new_run,
        carry_over=options.carry_over or req.carry_over,
    )
    return _runtime(setup, run_dir, fingerprint, options, wanted, role, order)


def shared_runtime(
    setup: RequestSetup, output_root: Path, options: RunOptions, run_dir: Path | None = None
) -> RequestRuntime:
    """The runtime of a request whose run another process owns (an xdist worker's): tasks are handed to it.

    :param run_dir: The run directory that owner chose (default: the one named by the run id).
    """
    req = setup.req
    fingerprint = request_fingerprint(req)
    run_dir = run_dir or output_root / req.name / options.run_id
    return _runtime(setup, run_dir, fingerprint, options, set(), join(run_dir, req.name, fingerprint), None)


def _runtime(
    setup: RequestSetup,
    run_dir: Path,
    fingerprint: str,
    options: RunOptions,
    wanted: set[str],
    role: RunRole,
    order: dict[str, int] | None,
) -> RequestRuntime:
    req = setup.req
    store = RunStore(run_dir, options.redactor, req.execution.max_stored_chars, req.execution.details_layout)
    for component in (setup.benchmark, setup.harness, setup.provider):
        if component is not None:
            component.run_dir = run_dir  # to read; what a component keeps there goes through the store:
            component.run_files = store.component_files  # the request's files (an attempt's: save_artifact)
    if setup.harness is not None:
        setup.harness.gateway = setup.gateway
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
        gateway=setup.gateway,
    )
    return RequestRuntime(
        ctx,
        setup.tasks,
        wanted,
        config_dump=options.config_dump,
        role=role,
        rerun_selected=options.rerun_selected,
        order=order,
    )
