"""Integrity findings: what a benchmark saw the agent tamper with, reported with the task everywhere.

Any benchmark (or harness) records findings in ``RunResult.metadata["integrity"]``,
a list of ``{"check": str, "path": str | None, "message": str}`` (the Harbor
verifier path fills it from what the agent changed in its container). The
runtime keeps them on the task's terminal result, from every semantic
attempt, and ``execution.integrity`` decides what they do:

- ``flag`` (the default): the score stands; the task is flagged in its
  detail, its junit properties, the terminal, the HTML report and
  ``summary.json`` (``counts.integrity_flagged``);
- ``strict``: a finding makes the task an ``evaluation_error`` (its score is
  not trusted: gates count it as a failure), never retried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ..vocabulary.outcome import INTEGRITY_KEY
from ..vocabulary.types import RunResult, RunStatus

__all__ = ["INTEGRITY_KEY", "enforce", "findings", "flagged", "merge_attempts", "summarize"]

#: The metadata key benchmarks record findings under.


def findings(result: RunResult) -> list[dict[str, Any]]:
    """The findings of ``result``, each ``{"check", "path", "message"}``.

    A value that is not such a list is a finding itself: a benchmark's malformed record must
    not hide what it meant to say.
    """
    raw = result.metadata.get(INTEGRITY_KEY)
    if raw is None or raw == []:
        return []
    if not isinstance(raw, list | tuple):
        return [_malformed(raw)]
    out = []
    for entry in raw:
        if isinstance(entry, Mapping) and isinstance(entry.get("check"), str) and isinstance(entry.get("message"), str):
            path = entry.get("path")
            item = {"check": entry["check"], "path": path if isinstance(path, str) else None}
            item["message"] = entry["message"]
            if "attempt" in entry:
                item["attempt"] = entry["attempt"]
            out.append(item)
        else:
            out.append(_malformed(entry))
    return out


def _malformed(value: Any) -> dict[str, Any]:
    text = repr(value)
    text = text if len(text) <= 200 else text[:200] + "..."
    return {"check": "malformed", "path": None, "message": f"metadata.integrity holds {text}, not a finding"}


def flagged(result: RunResult) -> bool:
    return bool(result.metadata.get(INTEGRITY_KEY))


def merge_attempts(result: RunResult, attempts: Mapping[int, RunResult]) -> RunResult:
    """``result`` (the task's, combined by its strategy) with the findings of every semantic attempt.

    A strategy keeps one attempt's metadata; a finding in another attempt is no less one.
    With several attempts each finding names its ``attempt``.
    """
    if len(attempts) <= 1:
        merged = findings(result)
    else:
        merged = [
            {**f, "attempt": f.get("attempt", index)} for index, r in sorted(attempts.items()) for f in findings(r)
        ]
    if not merged:
        return result if INTEGRITY_KEY not in result.metadata else _without(result)
    return dataclasses.replace(result, metadata={**result.metadata, INTEGRITY_KEY: merged})


def _without(result: RunResult) -> RunResult:
    return dataclasses.replace(result, metadata={k: v for k, v in result.metadata.items() if k != INTEGRITY_KEY})


def enforce(result: RunResult, mode: str) -> RunResult:
    """Under ``strict``, a flagged result becomes an ``evaluation_error``; its score is kept as evidence."""
    if mode != "strict" or not flagged(result):
        return result
    found = findings(result)
    metadata = {**result.metadata, "untrusted_score": result.score, "error_kind": "integrity"}
    return dataclasses.replace(
        result,
        status=RunStatus.EVALUATION_ERROR,
        score=None,
        error=f"integrity (strict): {summarize(found)}",
        metadata=metadata,
    )


def summarize(found: Iterable[Mapping[str, Any]], limit: int = 3) -> str:
    """``2 finding(s): tool-replaced /usr/bin/python3: ...; ...`` on one line."""
    items = list(found)
    shown = [
        f"{f.get('check')}" + (f" {f['path']}" if f.get("path") else "") + f": {f.get('message')}"
        for f in items[:limit]
    ]
    more = f"; and {len(items) - limit} more" if len(items) > limit else ""
    return f"{len(items)} finding(s): " + "; ".join(shown) + more
