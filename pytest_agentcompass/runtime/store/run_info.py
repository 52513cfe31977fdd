"""``run_info.json``: what a run is, with every plan it recorded folded in at the end.

The plans are appended to ``plans.jsonl`` while the run goes (one line per
plan, durable at once) and folded into ``run_info.json`` when the run ends,
last and at the top level, so that a reader that only wants what the run is
(:func:`read_run_info_head`) stops before them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["PLANS_KEY", "RUN_INFO", "fold_plans", "read_run_info_head"]

RUN_INFO = "run_info.json"
PLANS_KEY = "resolved_execution_plans"
#: Where :func:`fold_plans` starts the folded plans: always last, at the top level.
_PLANS_START = f',\n  "{PLANS_KEY}": {{'.encode()


def read_run_info_head(path: str | os.PathLike[str]) -> Any:
    """``run_info.json`` without its folded plans: what a run is, without what it planned.

    A finished run of 10,000 tasks has megabytes of plans in its
    ``run_info.json``; choosing a run to resume or carry over reads every earlier
    run's file, and parsing them whole cost seconds (and full garbage
    collections over the parsed plans). Reading the bytes is cheap; only the
    part before the plans is parsed. JSON strings hold no raw newline, so the
    marker is structure, and when no top-level key follows it (a key line
    starts with exactly two spaces, a plan with four) the plans are the last
    key, as :func:`fold_plans` writes them; otherwise (an older
    layout) the file is parsed whole.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    cut = data.find(_PLANS_START)
    if cut >= 0 and data.find(b'\n  "', cut + len(_PLANS_START)) < 0:
        return json.loads(data[:cut] + b"\n}")
    return json.loads(data)


def fold_plans(info_text: str, plans_path: Path) -> Iterator[str]:
    """``run_info.json`` (``info_text``: the info without plans, as indented JSON) with the plans
    of ``plans_path`` streamed in under ``resolved_execution_plans``: the last plan of each attempt."""
    yield info_text[: info_text.rindex("}")].rstrip() + ("," if info_text.strip() != "{}" else "")
    yield f'\n  "{PLANS_KEY}": {{'
    if plans_path.exists():
        with plans_path.open("rb") as fh:
            separator = "\n"
            for task, attempts in _plan_offsets(fh).items():
                parts = []
                for attempt, offset in attempts.items():
                    fh.seek(offset)
                    parts.append(f'"{attempt}": ' + fh.readline().decode("utf-8", "replace").rstrip("\n"))
                yield f"{separator}    {json.dumps(task)}: {{" + ", ".join(parts) + "}"
                separator = ",\n"
    yield "\n  }\n}"


def _plan_offsets(fh: BinaryIO) -> dict[str, dict[int, int]]:
    """Where the last plan of each attempt starts in ``plans.jsonl``, tasks in first-seen order.

    Each line is read as JSON; a line a kill cut short (or any line that
    is not a plan) is skipped, since its attempt was re-planned when the
    run resumed.
    """
    index: dict[str, dict[int, int]] = {}
    offset = 0
    for raw in fh:
        try:
            plan = json.loads(raw)
            task_id, attempt = str(plan["task_id"]), int(plan["attempt_index"])
        except (ValueError, TypeError, KeyError):
            pass
        else:
            index.setdefault(task_id, {})[attempt] = offset
        offset += len(raw)
    return index
