"""What the runtime needs to run the tasks of one request, built once per request."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..environments.markers import PROCESS_LABEL, this_process
from ..vocabulary.types import TaskSpec, to_jsonable

if TYPE_CHECKING:
    from ..analyzers.base import BaseAnalyzer
    from ..benchmarks.base import BaseBenchmark
    from ..concurrency.limits import CapacityPermits
    from ..config import RunRequest
    from ..environments.base import BaseEnvironment
    from ..gateway import ModelGateway
    from ..harnesses.base import BaseHarness
    from .planner import Planner
    from .store import RunStore
    from .strategies import AttemptStrategy

__all__ = ["RequestContext", "RuntimeEvents", "request_fingerprint", "task_fingerprint"]


@dataclass
class RuntimeEvents:
    """Callbacks the runtime fires for observers (progress display, tests)."""

    on_retry: Callable[[str, str], None] = lambda task_id, stage: None
    on_attempt_start: Callable[[str, int], None] = lambda task_id, index: None


@dataclass
class RequestContext:
    """The resolved components and run store of one request."""

    req: RunRequest
    benchmark: BaseBenchmark
    harness: BaseHarness | None
    provider: BaseEnvironment
    planner: Planner
    strategy: AttemptStrategy
    store: RunStore
    capacity: CapacityPermits
    run_id: str
    fingerprint: str
    analyzers: Sequence[BaseAnalyzer] = ()
    events: RuntimeEvents = field(default_factory=RuntimeEvents)
    #: The model gateway of a harness that asked for one (started on first use, closed with the request).
    gateway: ModelGateway | None = None
    _task_fingerprints: dict[str, str] = field(default_factory=dict, repr=False)

    def task_fingerprint(self, task: TaskSpec) -> str:
        """Changes whenever the result of ``task`` could change (computed once per task and process:
        a worker asks before running a task and again when it records it)."""
        known = self._task_fingerprints.get(task.task_id)
        if known is not None:
            return known
        digest = self._task_fingerprints[task.task_id] = task_fingerprint(self.fingerprint, task)
        return digest

    def labels(self, task: TaskSpec, attempt_index: int) -> dict[str, str]:
        return {
            "agentcompass.run": self.run_id,
            "agentcompass.request": self.req.name,
            "agentcompass.task": task.task_id,
            "agentcompass.attempt": str(attempt_index),
            PROCESS_LABEL: this_process(),
        }


def task_fingerprint(request_fingerprint: str, task: TaskSpec) -> str:
    """A digest of the request's settings and everything of ``task`` that can change its result."""
    fields = [
        request_fingerprint,
        task.task_id,
        task.question,
        task.category,
        task.ground_truth,
        task.evaluation_environment_mode,
        task.metadata,
        *([task.broken] if task.broken is not None else []),
    ]
    return _digest(fields)


def request_fingerprint(req: RunRequest) -> str:
    """A digest of every setting that can change a task's result.

    Retry budget, backoff, ``keep_environment``, limits and carry_over only change
    how a result is reached, so they are left out: changing them keeps
    checkpoints usable.
    """
    execution = req.execution
    relevant = {
        "benchmark": req.benchmark.model_dump(mode="json"),
        "harness": req.harness.model_dump(mode="json"),
        "model": req.model.model_dump(mode="json") if req.model else None,
        "judge": req.judge.model_dump(mode="json") if req.judge else None,
        "environment": {
            "id": req.environment.id,
            "params": req.environment.params,
            "mode": req.environment.evaluation_environment_mode,
            "network": req.environment.network.model_dump(mode="json"),
        },
        "execution": {
            "attempts": execution.attempts.model_dump(mode="json"),
            "pass_threshold": execution.pass_threshold,
            "timeouts": execution.timeouts.model_dump(mode="json"),
            # strict turns flagged results into errors; the default leaves earlier fingerprints alone
            **({"integrity": execution.integrity} if execution.integrity != "flag" else {}),
        },
    }
    return _digest(relevant)


def _digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, default=_canonical).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    """What the digest takes of a value JSON cannot write: a set's members in a fixed order (a
    set of strings iterates in an order each process's hash seed decides, and a resumed run,
    or an xdist worker and its controller, must agree); anything else, as always, the repr
    of its JSON-ready form."""
    if isinstance(value, set | frozenset):
        return sorted(json.dumps(member, sort_keys=True, default=_canonical) for member in value)
    return repr(to_jsonable(value))
