"""Baselines: what each task did in a reference run, and what changed since.

A baseline file is small JSON meant to be committed::

    {"format": "agentcompass.baseline/1",
     "requests": {"<request>": {"run_id": "...",
                                "tasks": {"<task_id>": {"state": "passed", "status": "scored", "score": 1.0}}}}}

``state`` is ``passed``, ``failed`` (a valid score below the threshold) or
``error``. A run directory serves as a baseline too: its ``summary.json``
(or, for a run that never finished, its ``details/``) is read the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..vocabulary.errors import AgentCompassError
from ..vocabulary.types import RunStatus

__all__ = [
    "BASELINE_FORMAT",
    "Baseline",
    "BaselineError",
    "Changes",
    "Known",
    "compare",
    "load_baseline",
    "read_run_tasks",
    "save_baseline",
    "state_of",
]

BASELINE_FORMAT = "agentcompass.baseline/1"
State = Literal["passed", "failed", "error"]


class BaselineError(AgentCompassError):
    """A baseline that cannot be read or written; the message names the path."""


@dataclass(frozen=True, slots=True)
class Known:
    """One task in a baseline or a run."""

    state: State
    status: str = ""
    score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "status": self.status, "score": self.score}


def state_of(status: str, passed: bool) -> State:
    try:
        is_error = RunStatus(status).is_error
    except ValueError:
        is_error = False
    return "error" if is_error else ("passed" if passed else "failed")


@dataclass
class Baseline:
    """Per request, per task: what the reference run did."""

    source: str
    requests: dict[str, dict[str, Known]] = field(default_factory=dict)

    def request(self, name: str) -> dict[str, Known] | None:
        return self.requests.get(name)


def read_run_tasks(run_dir: Path) -> tuple[str, dict[str, Known]]:
    """``(request name, tasks)`` of one run directory, from ``summary.json`` or else ``details/``.

    :raises BaselineError: when ``run_dir`` holds neither.
    """
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        summary = _read(summary_path)
        tasks = {
            str(t["task_id"]): Known(
                state_of(str(t.get("status", "")), bool(t.get("passed"))), str(t.get("status", "")), t.get("score")
            )
            for t in summary.get("tasks", [])
            if isinstance(t, dict) and "task_id" in t
        }
        return str(summary.get("request") or run_dir.parent.name), tasks
    # Here, not at the top: the plugin loads this module at configuration, the store's writers only to run.
    from ..runtime.store.details import DetailFiles, holds_details

    if not holds_details(run_dir):
        raise BaselineError(f"{run_dir}: not a run directory (no summary.json and no details/ folder)")
    tasks = {}
    name = run_dir.parent.name
    store = DetailFiles(run_dir)
    for task_id in store.detail_ids():
        detail = store.read_detail(task_id)
        if detail is None:  # cut short by a kill: a task not done
            continue
        status = str(detail.get("status", ""))
        tasks[detail["task_id"]] = Known(state_of(status, bool(detail.get("passed"))), status, detail.get("score"))
        name = str(detail.get("request") or name)
    return name, tasks


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """A baseline file or a run directory.

    :raises BaselineError: with the path and what is wrong with it.
    """
    source = Path(path)
    if source.is_dir():
        name, tasks = read_run_tasks(source)
        return Baseline(str(source), {name: tasks})
    if not source.exists():
        raise BaselineError(f"baseline {source}: no such file or run directory")
    data = _read(source)
    if data.get("format") != BASELINE_FORMAT or not isinstance(data.get("requests"), dict):
        raise BaselineError(f'baseline {source}: not a baseline file (expected "format": "{BASELINE_FORMAT}")')
    baseline = Baseline(str(source))
    try:
        for name, entry in data["requests"].items():
            baseline.requests[str(name)] = {
                str(task_id): Known(t["state"], str(t.get("status", "")), t.get("score"))
                for task_id, t in entry["tasks"].items()
            }
    except (KeyError, TypeError, AttributeError) as exc:
        raise BaselineError(f"baseline {source}: malformed entry ({type(exc).__name__}: {exc})") from None
    for name, tasks in baseline.requests.items():
        for task_id, known in tasks.items():
            if known.state not in ("passed", "failed", "error"):
                raise BaselineError(f"baseline {source}: {name}::{task_id}: unknown state {known.state!r}")
    return baseline


def save_baseline(path: str | os.PathLike[str], summaries: Iterable[Mapping[str, Any]]) -> Path:
    """Write the tasks of each finalized request's ``summary`` to ``path``.

    Saving merges into an existing file: requests and tasks this session did
    not run (``-k``, ``--lf``) keep their entries, so one file holds every
    task of a config. Delete the file to start over. A missing folder is
    created.

    :raises BaselineError: when the file cannot be written, or when ``path``
        holds something that is not a baseline (corrupt JSON, another file):
        it is never replaced in silence, since its entries would be lost.
    """
    target = Path(path)
    requests: dict[str, Any] = {}
    if target.exists():
        try:
            old = load_baseline(target) if target.is_file() else None
        except BaselineError as exc:
            raise BaselineError(f"{exc}; not overwritten (move it away or delete it to start over)") from None
        if old is None:
            raise BaselineError(f"cannot write baseline {target}: it is not a file")
        requests.update(_read(target)["requests"])
    for summary in summaries:
        tasks = {
            str(t["task_id"]): Known(
                state_of(str(t["status"]), bool(t["passed"])), str(t["status"]), t["score"]
            ).to_dict()
            for t in summary.get("tasks", [])
        }
        before = requests.get(str(summary["request"]))
        kept = before.get("tasks", {}) if isinstance(before, dict) else {}
        requests[str(summary["request"])] = {"run_id": summary.get("run_id"), "tasks": {**kept, **tasks}}
    text = _format(requests)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise BaselineError(f"cannot write baseline {target}: {exc.strerror or exc}") from None
    return target


@dataclass
class Changes:
    """What changed between a baseline and a run, for one request."""

    regressions: list[str] = field(default_factory=list)  # passed before, not now
    improvements: list[str] = field(default_factory=list)  # not passing before, passing now
    still_failing: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)  # not in the baseline
    missing: list[str] = field(default_factory=list)  # in the baseline, not in the run

    def change_of(self) -> dict[str, str]:
        """Task id -> ``regression`` / ``improvement`` / ``still failing`` / ``new``."""
        out: dict[str, str] = {}
        for label, ids in (
            ("regression", self.regressions),
            ("improvement", self.improvements),
            ("still failing", self.still_failing),
            ("new", self.new),
        ):
            out.update(dict.fromkeys(ids, label))
        return out


def compare(old: Mapping[str, Known], new: Mapping[str, Known]) -> Changes:
    changes = Changes()
    for task_id, now in new.items():
        before = old.get(task_id)
        if before is None:
            changes.new.append(task_id)
        elif before.state == "passed" and now.state != "passed":
            changes.regressions.append(task_id)
        elif before.state != "passed" and now.state == "passed":
            changes.improvements.append(task_id)
        elif now.state != "passed":
            changes.still_failing.append(task_id)
    changes.missing = [task_id for task_id in old if task_id not in new]
    return changes


def _format(requests: Mapping[str, Any]) -> str:
    """One task per line: a committed baseline diffs by task."""
    lines = ["{", f'  "format": "{BASELINE_FORMAT}",', '  "requests": {']
    for n, (name, entry) in enumerate(sorted(requests.items())):
        lines.append(f'    {json.dumps(name)}: {{"run_id": {json.dumps(entry.get("run_id"))}, "tasks": {{')
        tasks = sorted(entry.get("tasks", {}).items())
        lines += [
            f"      {json.dumps(t)}: {json.dumps(v)}" + ("," if i < len(tasks) - 1 else "")
            for i, (t, v) in enumerate(tasks)
        ]
        lines.append("    }}" + ("," if n < len(requests) - 1 else ""))
    return "\n".join([*lines, "  }", "}"])


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise BaselineError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BaselineError(f"{path}: expected a JSON object")
    return data
