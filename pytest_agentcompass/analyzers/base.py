"""Analyzers: post-evaluation observations that never change a score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..vocabulary.types import RunResult, TaskSpec

if TYPE_CHECKING:
    from ..config import RunRequest

__all__ = ["BaseAnalyzer", "select_analyzers"]


class BaseAnalyzer:
    """Looks at a task's terminal result and returns JSON-ready findings.

    Eligibility is declared, not coded: :attr:`datasets` (benchmark ids this
    analyzer understands, ``None`` for any), :attr:`requires` (keys that must
    be present in ``result.artifacts``) and :attr:`family` (only the first
    configured analyzer of a family that is eligible runs for a task).
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    datasets: ClassVar[frozenset[str] | None] = None
    requires: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **params: Any) -> None:
        self.params = params

    def is_eligible(self, task: TaskSpec, result: RunResult, req: RunRequest) -> bool:
        if self.datasets is not None and req.benchmark.id not in self.datasets:
            return False
        return all(key in result.artifacts for key in self.requires)

    def analyze(self, task: TaskSpec, result: RunResult, req: RunRequest) -> Mapping[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement analyze(task, result, req)")


def select_analyzers(
    analyzers: Sequence[BaseAnalyzer], task: TaskSpec, result: RunResult, req: RunRequest
) -> list[BaseAnalyzer]:
    """The eligible analyzers in config order, one per family."""
    chosen: list[BaseAnalyzer] = []
    families: set[str] = set()
    for analyzer in analyzers:
        family = analyzer.family or analyzer.name or type(analyzer).__name__
        if family in families or not analyzer.is_eligible(task, result, req):
            continue
        families.add(family)
        chosen.append(analyzer)
    return chosen
