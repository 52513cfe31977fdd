"""TaskOutcome: a terminal task as the pytest face, the hooks and the reports receive it.

It sits with the vocabulary (not in ``runtime/``) because plugin authors meet it in
hooks (``pytest_agentcompass_task_finished``) and reports read it; the runtime makes it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .types import RunResult, TaskSpec

__all__ = ["INTEGRITY_KEY", "TaskOutcome"]

#: The metadata key of a result's integrity findings (``runtime/integrity.py`` owns their logic).
INTEGRITY_KEY = "integrity"
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(slots=True)  # one per task lives until the end of the run
class TaskOutcome:
    """A terminal task, as the pytest face and the finalizer see it."""

    request: str
    task: TaskSpec
    result: RunResult
    passed: bool
    evaluation_environment_mode: str = ""
    attempts: int = 0
    retries: int = 0
    cleanup_errors: list[str] = field(default_factory=list)
    kept_environments: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trace: str | None = None
    duration: float = 0.0
    #: The task's detail file (a ``str``: ten thousand ``Path`` objects are megabytes).
    detail_path: str | None = None
    #: Taken from an earlier run's record (``carry_over``), or from the interrupted run this one resumes.
    carried_over: bool = False
    resumed: bool = False
    logs: list[str] = field(default_factory=list)
    #: What the task printed (stdout and stderr), shown with its report.
    output: str = ""
    #: Why the detail record could not be written (the result itself stands).
    storage_error: str | None = None
    #: Why its request ran nothing (a failed preflight): printed once in the
    #: summary, and carried by each task's junit error.
    not_run_reason: str | None = None

    @property
    def reused(self) -> bool:
        """The name :attr:`carried_over` had before (until 0.3.0)."""
        warnings.warn(
            "TaskOutcome.reused is now TaskOutcome.carried_over; the old name stops working in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.carried_over

    def slim(self) -> None:
        """Drop what only reporting needed, once reported: output, artifacts,
        evidence, logs and trace live on in the detail file, not in memory."""
        if self.detail_path is None:
            return  # no detail to read the result back from: keep it whole
        result = self.result
        # attempt_scores stays: the default aggregation needs nothing else;
        # usage (a few counts) feeds the request's token totals; integrity findings are reported.
        kept = {k: result.metadata[k] for k in ("attempt_scores", "usage", INTEGRITY_KEY) if k in result.metadata}
        self.result = RunResult(
            result.task_id,
            score=result.score,
            status=result.status,
            error=result.error,
            artifacts=_EMPTY,
            metadata=kept or _EMPTY,
        )
        self.logs = []
        self.output = ""
        self.trace = None
