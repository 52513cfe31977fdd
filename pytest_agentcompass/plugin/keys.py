"""The one stash key through which every part of the pytest face reaches the active run.

A leaf of the plugin's import graph: nodes, fixtures and the xdist glue know
the run only as :class:`RunHandle` (what they may ask of it), so none of them
imports ``run``, which imports them. The names of what crosses between
xdist's processes (``workerinput``, ``workeroutput``, a serialized report)
are here too, for both sides to share.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from ..config import LoadedConfig, Orchestration, RunRequest
    from ..runtime.assembly import RequestSetup
    from ..runtime.orchestrator import OrchestrationResult, Orchestrator
    from ..runtime.request import RequestRuntime
    from ..vocabulary.outcome import TaskOutcome
    from ..vocabulary.redact import Redactor

__all__ = [
    "DEV_MODE",
    "EVENTS",
    "NOT_RUN",
    "PERMITS",
    "RUN_DIRS",
    "RUN_ID",
    "WORKER_DETAILS",
    "WORKER_FAILED",
    "WORKER_NOTES",
    "RunHandle",
    "run_key",
]

#: ``config.workerinput`` keys, set by the xdist controller for each worker.
RUN_ID, RUN_DIRS, PERMITS = "agentcompass_run_id", "agentcompass_run_dirs", "agentcompass_permits"
#: The xdist event that carries several of a worker's events in one message (``plugin/wire.py``);
#: in ``workerinput``, that the controller unpacks it.
EVENTS = "agentcompass_events"
#: ``config.workerinput`` key: the controller runs under Python's development mode (``-X dev``), which
#: its workers' interpreters do not inherit from the command line: they collect at exit as it does.
DEV_MODE = "agentcompass_dev_mode"
#: ``workeroutput`` key: ``{request: [note, ...]}`` from a worker's providers and closing requests.
WORKER_NOTES = "agentcompass_notes"
#: ``workeroutput`` key: ``{request: [(task id, detail text, page record), ...]}``, every detail the worker wrote.
WORKER_DETAILS = "agentcompass_details"
#: ``workeroutput`` key: ``{request: reason}`` for each request that failed on the worker (its preflight).
WORKER_FAILED = "agentcompass_failed"
#: A serialized report's key for the two parts of an ``outcomes.NotRunText``.
NOT_RUN = "agentcompass_not_run"
#: A serialized report's key for the text of an ``outcomes.ProblemText``.
PROBLEM = "agentcompass_problem"


class RunHandle(Protocol):
    """What the pytest face's modules use of the active run (``run.AgentCompassRun``)."""

    config: pytest.Config
    loaded: LoadedConfig
    run_id: str
    #: The requests of this session that ran here (in process) or were finalized (the xdist controller).
    runtimes: list[RequestRuntime]
    #: The task items run by the plugin's own loop (in process).
    items: list[Any]
    #: How the run ended, once it did.
    result: OrchestrationResult | None
    #: Masks the config's ``${VAR}`` values in whatever pytest prints.
    redactor: Redactor
    #: Baselines, gates and the session's reports (``verdicts.Verdicts``); its ``gates`` judges each request once.
    verdicts: Any
    #: Each request built in this process (components and tasks), by name.
    setups: dict[str, RequestSetup]

    @property
    def orchestration(self) -> Orchestration: ...

    @property
    def is_worker(self) -> bool: ...

    @property
    def task_concurrency(self) -> int:
        """The run-wide ``task_concurrency``: ``--agentcompass-concurrency``, else the config's."""
        ...

    def build(self, index: int, req: RunRequest, node: pytest.Collector | None = None) -> RequestSetup:
        """Build request ``index`` (components and tasks) once per process."""
        ...

    def own_runtime(
        self, setup: RequestSetup, wanted: set[str], *, resume: bool = True, order: dict[str, int] | None = None
    ) -> RequestRuntime:
        """The runtime of a request whose run directory this process owns (``runtime.runtimes.own_runtime``)."""
        ...

    def shared_runtime(self, setup: RequestSetup, run_dir: Path | None) -> RequestRuntime:
        """The runtime of a request whose run another process owns (``runtime.runtimes.shared_runtime``)."""
        ...

    def orchestrator(self, states: Sequence[RequestRuntime], *, fed: bool = False, **observers: Any) -> Orchestrator:
        """The Orchestrator of ``states`` with the session's settings (concurrency, deadline, grace, permits).

        ``observers``: the Orchestrator's ``on_outcome``, ``on_event``, ``on_tick``... keyword arguments.
        """
        ...

    def task_output(self) -> AbstractContextManager[None]:
        """While tasks run: their log records and printed output go to their own reports."""
        ...

    def run_single(self, item: Any) -> TaskOutcome:
        """Run one task item in this process (pytest's standard protocol)."""
        ...

    def release_outcomes(self) -> None:
        """Every item has run: keep what the terminal summary prints, release the outcomes."""
        ...

    def unregister(self) -> None:
        """Release the run's state and unregister its plugins (``pytest_unconfigure``)."""
        ...

    def task_finished(self, item: Any, outcome: TaskOutcome) -> None:
        """Keep ``outcome`` on ``item`` and fire ``pytest_agentcompass_task_finished``."""
        ...

    def request_finalized(self, state: RequestRuntime) -> None:
        """Write the run's page and fire ``pytest_agentcompass_request_finalized`` for a finalized request."""
        ...

    def say(self, line: str) -> None:
        """A line on the terminal while tasks run, even under ``-q``."""
        ...

    def say_resuming(self, state: RequestRuntime) -> None:
        """Say that ``state`` continues an interrupted run, and how much of it was done."""
        ...

    def usage_error(self, exc: Exception) -> pytest.UsageError:
        """The error pytest prints for ``exc``, ``${VAR}`` values masked."""
        ...


#: The active run of this pytest session; set in ``pytest_configure`` when
#: ``--agentcompass`` is given, removed in ``pytest_unconfigure``.
run_key: pytest.StashKey[RunHandle] = pytest.StashKey()
