"""pytest collection nodes: config file -> requests -> tasks.

Node ids read ``<config file>::<request name>::<task_id>``: the config file
as pytest names files (relative to the rootdir), or its absolute path when it
lies outside the rootdir, so that every node id can be passed back to pytest.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..config import RunRequest
from ..runtime.assembly import RequestSetup
from ..runtime.traces import format_trace
from ..vocabulary.errors import AgentCompassError
from ..vocabulary.types import TaskSpec
from .keys import RunHandle, run_key
from .outcomes import NotRunText, ProblemText, TaskNotRun, TaskProblem, phase_problems, set_properties, shown

if TYPE_CHECKING:
    from _pytest._code.code import ExceptionInfo, TerminalRepr

    from ..vocabulary.outcome import TaskOutcome

__all__ = ["ConfigFile", "RequestNode", "TaskItem", "category_marker", "register_category_markers"]

_MARKER_UNSAFE = re.compile(r"[^\w.-]+")


def category_marker(category: str) -> str:
    """A marker name usable in ``-m`` expressions for ``category``."""
    return _MARKER_UNSAFE.sub("_", category).strip("_") or "uncategorized"


def register_category_markers(config: pytest.Config, tasks: Sequence[TaskSpec]) -> None:
    """Declare each task category and tag as a marker (``--strict-markers``, ``--markers``)."""
    known = set(config.getini("markers"))
    labels = [(t.category, "category") for t in tasks if t.category]
    labels += [(tag, "tag") for t in tasks for tag in t.tags]
    for label, kind in dict.fromkeys(labels):
        line = f"{category_marker(label)}: agentcompass task {kind} {label!r}"
        if line not in known:
            config.addinivalue_line("markers", line)
            known.add(line)


class ConfigFile(pytest.File):
    """The agentcompass YAML file given with ``--agentcompass``."""

    @classmethod
    def for_path(cls, parent: pytest.Collector, path: Path) -> ConfigFile:
        """The node of the config at ``path``.

        pytest names a file outside the rootdir by its path from the argument
        that led to it, and the config is that argument: its id would be
        empty, its tasks' ``::request::task``, which no command line can
        select (nor ``--lf``). Its absolute path names it from any folder.
        """
        try:
            path.relative_to(parent.config.rootpath)
        except ValueError:
            node: ConfigFile = cls.from_parent(parent, path=path, nodeid=path.as_posix())
        else:
            node = cls.from_parent(parent, path=path)
        return node

    @property
    def run(self) -> RunHandle:
        return self.config.stash[run_key]

    def collect(self) -> Iterable[RequestNode]:
        for index, req in enumerate(self.run.orchestration.requests):
            yield RequestNode.from_parent(self, name=req.name, index=index, req=req)


class _Escaped(Exception):
    """A ``BaseException`` raised while a request loaded, carried as an error of its collection."""

    def __init__(self, escaped: BaseException) -> None:
        super().__init__(repr(escaped))
        self.escaped = escaped


class RequestNode(pytest.Collector):
    """One request: loads its benchmark's tasks once and yields an item per task."""

    def __init__(self, *, index: int, req: RunRequest, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.req = req
        #: The config file's path as pytest shows it (``Item.location``), worked out once for every task.
        self.shown_path: str | None = None

    def collect(self) -> Iterable[pytest.Item]:
        try:
            setup = self.config.stash[run_key].build(self.index, self.req, self)
        except (KeyboardInterrupt, Exception):
            raise
        except BaseException as exc:
            # sys.exit() (or another BaseException) in a component's module or __init__, in
            # load_tasks or select_tasks: pytest would end in INTERNALERROR; it is this request's error.
            raise _Escaped(exc) from exc
        if not setup.tasks:  # nothing to run must not pass for success in silence
            why = "load_tasks returned no tasks" if not setup.loaded else f"select_tasks kept none of {setup.loaded}"
            self.warn(pytest.PytestWarning(f"agentcompass: request {self.req.name!r}: {why}"))
        register_category_markers(self.config, setup.tasks)
        for task in setup.tasks:
            item = TaskItem.from_parent(self, name=task.task_id, task=task, setup=setup)
            for label in (task.category, *task.tags):
                if label:
                    item.add_marker(category_marker(label))
            yield item
        if self.req.gates:
            from .gate_items import GATE_NAME, GateItem

            # A task may be called "gates" too: the node ids must stay distinct.
            taken = {task.task_id for task in setup.tasks}
            name = GATE_NAME if GATE_NAME not in taken else f"{GATE_NAME}[agentcompass]"
            yield GateItem.from_parent(self, name=name, req=self.req)

    def repr_failure(self, excinfo: ExceptionInfo[BaseException]) -> str | TerminalRepr:  # type: ignore[override]
        if isinstance(excinfo.value, AgentCompassError):
            return ProblemText(shown(str(excinfo.value), where=None))  # type: ignore[return-value]
        exc = excinfo.value.escaped if isinstance(excinfo.value, _Escaped) else excinfo.value
        trace = shown(format_trace(exc) or f"{type(exc).__name__}: {exc}", where=None)
        # The exception's own first line (not the trace's last: a message of several lines, a note).
        said = shown(traceback.format_exception_only(exc)[0].rstrip("\n").split("\n", 1)[0], limit=500, where=None)
        return ProblemText(f"request {self.req.name!r}: loading tasks failed: {said}\n{trace}")  # type: ignore[return-value]


class TaskItem(pytest.Item):
    """One task. The plugin's loops (in process, and on xdist workers) run it
    and replay its reports; only when another plugin's loop runs items through
    pytest's own protocol does it run itself, in ``setup`` (docs/how-it-works.md,
    "Three ways a task runs")."""

    def __init__(self, *, task: TaskSpec, setup: RequestSetup, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.task = task
        self.setup_info = setup
        self.outcome: TaskOutcome | None = None
        if task.category:
            self.extra_keyword_matches.add(task.category)
        self.extra_keyword_matches.update(task.tags)
        self.extra_keyword_matches.update(task.aliases)

    @property
    def request_name(self) -> str:
        return self.setup_info.req.name

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.request_name}::{self.name}"

    @cached_property
    def location(self) -> tuple[str, int | None, str]:
        """pytest's, but the path relative to the root is worked out once per request: pytest's
        own makes the same path absolute and looks it up again for each of 10,000 tasks."""
        parent = self.parent
        if not isinstance(parent, RequestNode):
            return pytest.Item.location.func(self)  # type: ignore[attr-defined,no-any-return]
        if parent.shown_path is None:
            parent.shown_path = pytest.Item.location.func(self)[0]  # type: ignore[attr-defined]
        return parent.shown_path, None, f"{self.request_name}::{self.name}"

    # -- pytest's own protocol (another plugin's loop runs the items) ----------------
    def _problem(self, when: str) -> None:
        assert self.outcome is not None
        problem = phase_problems(self.outcome, self.setup_info.req.execution.pass_threshold)[when]  # type: ignore[index]
        if problem is not None:
            raise problem

    def setup(self) -> None:
        self.outcome = self.config.stash[run_key].run_single(self)
        set_properties(self, self.outcome)
        self._problem("setup")

    def runtest(self) -> None:
        self._problem("call")

    def teardown(self) -> None:
        if self.outcome is not None:
            self._problem("teardown")

    def repr_failure(self, excinfo: ExceptionInfo[BaseException], style: Any = None) -> str | TerminalRepr:
        if isinstance(excinfo.value, TaskProblem):  # as in setup and teardown: the text, its first line the reason
            return self._repr_failure_py(excinfo, style)
        return super().repr_failure(excinfo, style)

    def _repr_failure_py(self, excinfo: ExceptionInfo[BaseException], style: Any = None) -> TerminalRepr:
        if isinstance(excinfo.value, TaskNotRun):
            return NotRunText(str(excinfo.value), excinfo.value.reason)  # type: ignore[return-value]
        if isinstance(excinfo.value, TaskProblem):
            return ProblemText(str(excinfo.value))  # type: ignore[return-value]
        return super()._repr_failure_py(excinfo, style)
