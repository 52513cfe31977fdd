"""What changes under pytest-xdist (``-n``): each process registers the side it is.

- The controller (:mod:`.controller`) runs no task but owns every request's
  run: it claims, prepares and finalizes the run directories, serves the
  run-wide limits, and reports the gate items; :mod:`.interrupts` keeps a
  Ctrl-C there from losing the run's record.
- A worker (:mod:`.worker`) runs the tasks handed to it concurrently, on the
  same Orchestrator as a session without xdist, sharing each run with the
  controller and counting its limits through the controller's permit service.
- Both translate reports on the wire (:mod:`.wire`).

How the three ways a task runs fit together is in docs/how-it-works.md,
"Three ways a task runs".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import wire
from .keys import PERMITS, RUN_DIRS

if TYPE_CHECKING:
    from .keys import RunHandle

__all__ = ["PLUGIN_NAMES", "register_side"]

WORKER, CONTROLLER, INTERRUPTS, WIRE = (
    "agentcompass-worker",
    "agentcompass-controller",
    "agentcompass-interrupts",
    "agentcompass-wire",
)
#: Every plugin this module may register (the run unregisters them at ``pytest_unconfigure``).
PLUGIN_NAMES = (WORKER, CONTROLLER, INTERRUPTS, WIRE)


def register_side(run: RunHandle) -> None:
    """Register the worker's loop, or the controller's hooks, for this process (``pytest_configure``)."""
    manager = run.config.pluginmanager
    workerinput = getattr(run.config, "workerinput", None)
    if workerinput is not None:
        from .worker import WorkerPlugin

        if workerinput.get(PERMITS):
            from ..concurrency.limits import use_permit_service

            use_permit_service(workerinput[PERMITS])
        manager.register(WorkerPlugin(run, workerinput.get(RUN_DIRS) or {}), WORKER)
    else:
        from .controller import ControllerRun
        from .interrupts import ControllerInterrupts

        controller = ControllerRun(run)
        manager.register(controller, CONTROLLER)
        manager.register(ControllerInterrupts(controller), INTERRUPTS)
    manager.register(wire, WIRE)
