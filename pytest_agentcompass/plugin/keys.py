"""The one stash key through which every part of the pytest face reaches the active run.

A leaf of the plugin's import graph: nodes, fixtures and the xdist glue know
the run only as :class:`RunHandle` (what they may ask of it), so none of them
imports ``run``, which imports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from ..config import LoadedConfig, Orchestration, RunRequest
    from ..redact import Redactor
    from ..runtime.assembly import RequestSetup
    from ..runtime.orchestrator import OrchestrationResult
    from ..runtime.request import RequestRuntime
    from ..runtime.task import TaskOutcome

__all__ = ["RunHandle", "run_key"]


class RunHandle(Protocol):
    """What the pytest face's modules use of the active run (``run.AgentCompassRun``)."""

    config: pytest.Config
    loaded: LoadedConfig
    run_id: str
    runtimes: list[RequestRuntime]
    result: OrchestrationResult | None
    #: Masks the config's ``${VAR}`` values in whatever pytest prints.
    redactor: Redactor
    #: The xdist glue (``xdist.DistributedRun``) when ``-n`` is in use.
    distributed: Any
    #: Baselines, gates and the session's reports (``ci.CiRun``); its ``gates`` judges each request once.
    ci: Any
    #: Each request built in this process (components and tasks), by name.
    setups: dict[str, RequestSetup]

    @property
    def orchestration(self) -> Orchestration: ...

    @property
    def is_worker(self) -> bool: ...

    def build(self, index: int, req: RunRequest, node: pytest.Collector | None = None) -> RequestSetup:
        """Build request ``index`` (components and tasks) once per process."""
        ...

    def runtime(self, setup: RequestSetup, wanted: set[str], **kwargs: Any) -> RequestRuntime:
        """The runtime of one request (see ``runtime.assembly.make_runtime``)."""
        ...

    def run_single(self, item: Any) -> TaskOutcome:
        """Run one task item in this process (the standard protocol)."""
        ...

    def unregister(self) -> None:
        """Release the run's state and unregister its plugins (``pytest_unconfigure``)."""
        ...

    def task_finished(self, item: Any, outcome: TaskOutcome) -> None:
        """Keep ``outcome`` on ``item`` and fire ``pytest_agentcompass_task_finished``."""
        ...

    def request_finalized(self, state: RequestRuntime, details: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Write the run's page and fire ``pytest_agentcompass_request_finalized`` for a finalized request.

        ``details``: every detail record of the run, when the caller has just read them all.
        """
        ...

    def say(self, line: str) -> None:
        """A line on the terminal while tasks run, even under ``-q``."""
        ...

    def usage_error(self, exc: Exception) -> pytest.UsageError:
        """The error pytest prints for ``exc``, ``${VAR}`` values masked."""
        ...


#: The active run of this pytest session; set in ``pytest_configure`` when
#: ``--agentcompass`` is given, removed in ``pytest_unconfigure``.
run_key: pytest.StashKey[RunHandle] = pytest.StashKey()
