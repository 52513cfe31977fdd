"""What the run's page (``reports.html``) shows of each detail, kept in memory as the details are written or read.

The page used to read every ``details/<task>.json`` back at the end of a run
and decode it again: 10,000 decodes of records the process had just encoded.
The store keeps instead, per task, the few fields the page shows, taken from
the very value it wrote (redacted, bounded, as the file holds it), with long
texts cut to what the page could ever show (:class:`Cut` keeps their length,
so the page says how much it left out exactly as it did from the file).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from ...vocabulary.types import to_jsonable

__all__ = ["LONGEST_SHOWN", "Cut", "page_record"]

#: The most characters of one text the page shows (its clip is at most 8,000, traces and messages twice that).
LONGEST_SHOWN = 16_000
#: Detail fields the page shows as they are (numbers, flags, short names).
_AS_IS = ("task_id", "status", "passed", "score", "category", "attempts", "retries", "duration", "trajectory")
#: Detail fields the page shows clipped.
_TEXTS = ("output", "error", "trace")


class Cut(NamedTuple):
    """The start of a text longer than the page shows, and the text's full length."""

    head: str
    length: int


def _plain(value: Any) -> Any:
    """``value`` as the detail file holds it (decoded JSON), for the rare value that is not plain JSON already."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    return json.loads(json.dumps(value, default=to_jsonable))


def _text(value: Any) -> Any:
    """A text the page clips: whole when short, else a :class:`Cut` (non-text values as the page renders them)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(_plain(value), default=str)
    return text if len(text) <= LONGEST_SHOWN else Cut(text[:LONGEST_SHOWN], len(text))


def page_record(detail: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``detail`` (as written: redacted, bounded) that the run's page reads; absent keys read as None."""
    out: dict[str, Any] = {}
    for key in _AS_IS:
        value = detail.get(key)
        if value is not None:
            out[key] = _plain(value)
    for key in _TEXTS:
        value = detail.get(key)
        if value is not None:
            out[key] = _text(value)
    notes = detail.get("notes")
    if notes:
        out["notes"] = [_text(n) for n in notes] if isinstance(notes, list) else notes
    metadata = detail.get("metadata")
    if isinstance(metadata, Mapping):
        kept = {k: _plain(metadata[k]) for k in ("usage", "integrity", "trajectory") if metadata.get(k) is not None}
        if kept:
            out["metadata"] = kept
    elif metadata:
        out["metadata"] = _plain(metadata)
    attempts = detail.get("attempt_results")
    if isinstance(attempts, Mapping) and attempts:
        out["attempt_results"] = {
            str(i): {"status": _plain(a.get("status")), "score": _plain(a.get("score")), "error": _text(a.get("error"))}
            if isinstance(a, Mapping)
            else None
            for i, a in attempts.items()
        }
    artifacts = detail.get("artifacts")
    if artifacts:
        out["artifacts"] = _plain(artifacts)
    return out
