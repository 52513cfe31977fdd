"""Where a Harbor task's verifier runs: the verifier modes, as plan data.

- ``shared``: in the agent's own container, after it (``reuse``). Whatever
  the agent left running keeps running: honest services stay up for the
  tests, and so does anything that would tamper. Findings say what was there.
- ``snapshot``: the agent's container is frozen (every process ends) and
  committed; the verifier runs in a new container from that image
  (``fresh``). The whole file system survives, no agent process does. The
  spec's ``fresh`` evaluation of a task container, done so the agent's work
  is what gets verified.
- ``separate``: Harbor's ``[verifier] environment_mode = "separate"``: a
  verifier container of its own, built from ``tests/`` (its Dockerfile, or
  ``[verifier.environment] docker_image``), that gets only
  ``/logs/artifacts`` and the task's ``artifacts = [...]`` paths (``fresh``).

The choice (:func:`verifier_mode`): the benchmark's ``verifier_mode`` param;
else the request's ``evaluation_environment_mode`` (``fresh``: ``snapshot``,
or ``separate`` for a task that asks for it; ``reuse``: ``shared``); else
the task's own ``environment_mode``; else ``shared``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from ...vocabulary.errors import ComponentError
from ...vocabulary.types import EvaluationMode, NetworkPolicy
from .taskdir import HarborTask

if TYPE_CHECKING:
    from ...config import RunRequest

__all__ = ["MODES", "VerifierMode", "check_request", "evaluation_params", "evaluation_policy", "verifier_mode"]

VerifierMode = Literal["shared", "snapshot", "separate"]
MODES: tuple[VerifierMode, ...] = ("shared", "snapshot", "separate")
#: The runtime's evaluation mode each verifier mode runs in.
RUNTIME_MODE: dict[VerifierMode, EvaluationMode] = {"shared": "reuse", "snapshot": "fresh", "separate": "fresh"}


def check_request(param: VerifierMode | None, req: RunRequest) -> None:
    """Refuse a request whose settings contradict each other (said once, when its tasks load).

    :raises ComponentError: naming both settings.
    """
    asked = req.environment.evaluation_environment_mode
    if asked == "none":
        raise ComponentError(
            "benchmark 'harbor': environment.evaluation_environment_mode 'none' cannot verify a Harbor task "
            "(its verifier runs in a container); use 'reuse' (the shared verifier) or 'fresh' (a snapshot)"
        )
    if param is not None and asked is not None and RUNTIME_MODE[param] != asked:
        raise ComponentError(
            f"benchmark 'harbor': params.verifier_mode {param!r} needs evaluation mode "
            f"{RUNTIME_MODE[param]!r}, but environment.evaluation_environment_mode is {asked!r}; drop one of them"
        )


def verifier_mode(param: VerifierMode | None, req: RunRequest, task: HarborTask) -> VerifierMode:
    if param is not None:
        return param
    asked = req.environment.evaluation_environment_mode
    if asked == "reuse":
        return "shared"
    if asked == "fresh":
        return "separate" if task.verifier_mode == "separate" else "snapshot"
    return "separate" if task.verifier_mode == "separate" else "shared"


def evaluation_policy(mode: VerifierMode, task: HarborTask, req: RunRequest, planned: NetworkPolicy) -> NetworkPolicy:
    """The verifier's network: the request's ``network.evaluation`` when it sets one; else none when
    the verifier's environment has no internet (the task's, or ``[verifier.environment]``'s for a
    separate verifier), else what the plan has."""
    if req.environment.network.evaluation is not None:
        return planned
    allowed = task.allow_internet
    if mode == "separate" and task.verifier_environment and task.verifier_environment.allow_internet is not None:
        allowed = task.verifier_environment.allow_internet
    return planned if allowed else "disabled"


def evaluation_params(mode: VerifierMode, task: HarborTask) -> dict[str, Any]:
    """Provider params the evaluation session takes over the task's (``ExecutionPlan.environment["evaluation"]``)."""
    if mode == "snapshot":
        return {"from_snapshot": True}
    if mode == "shared":
        return {}
    own = task.verifier_environment
    params: dict[str, Any] = {}
    tests = task.path / "tests"
    if (tests / "Dockerfile").is_file():  # tests/ is the verifier's build context: its tests are baked in
        build_timeout = (own.build_timeout if own else None) or task.build_timeout
        params.update(image=None, task_image=None, build={"context": str(tests), "timeout": build_timeout})
    if own is not None:
        if own.docker_image:  # used when the engine has it; else tests/Dockerfile is built
            params.update(image=None, task_image=own.docker_image)
        # A [verifier.environment] table is the verifier's whole sandbox: unset limits are none.
        params.update(cpus=own.cpus, memory_mb=own.memory_mb, storage_mb=own.storage_mb, workdir=own.workdir)
    return params


def tests_baked_in(mode: VerifierMode, task: HarborTask) -> bool:
    """Whether the verifier's image brings ``/tests`` (a separate verifier built from ``tests/``)."""
    own = task.verifier_environment
    return mode == "separate" and ((task.path / "tests" / "Dockerfile").is_file() or bool(own and own.docker_image))
