"""What the run's page (``reports.html``) shows of each detail, kept in memory as the details are written or read.

The page used to read every ``details/<task>.json`` back at the end of a run
and decode it again: 10,000 decodes of records the process had just encoded.
The store keeps instead, per task, the few fields the page shows, taken from
the very value it wrote (redacted, bounded, as the file holds it), with long
texts cut to what the page could ever show (:class:`Cut` keeps their length,
so the page says how much it left out exactly as it did from the file).

Each record is held pickled (:class:`PageRecords`): about 230 bytes for a
small task where the dict took about 900, which is most of what a task kept
for the page (issue 27: peak memory at 10,000 and 100,000 tasks). The page
decodes them one at a time, in its order, as it writes them.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

from ...vocabulary.types import to_jsonable

__all__ = ["LONGEST_SHOWN", "Cut", "PageRecords", "page_record", "packed"]

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


def packed(record: Mapping[str, Any]) -> bytes:
    """``record`` as :class:`PageRecords` holds it (pickled: it keeps :class:`Cut` a ``Cut``)."""
    return pickle.dumps(record, pickle.HIGHEST_PROTOCOL)


def _unpacked(blob: bytes) -> Mapping[str, Any]:
    record: Mapping[str, Any] = pickle.loads(blob)
    return record


class PageRecords(Sequence[Mapping[str, Any]]):
    """The page records of one run by task id, held packed and decoded as they are read.

    A read-only view of the store's own mapping (nothing is copied).
    """

    def __init__(self, packed_by_task: Mapping[str, bytes]) -> None:
        self._by_task = packed_by_task

    def __len__(self) -> int:
        return len(self._by_task)

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Mapping[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> Mapping[str, Any] | Sequence[Mapping[str, Any]]:
        blobs = list(self._by_task.values())
        if isinstance(index, slice):
            return [_unpacked(blob) for blob in blobs[index]]
        return _unpacked(blobs[index])

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return map(_unpacked, self._by_task.values())

    def order(self, key: Callable[[str], Any]) -> list[str]:
        """The task ids, sorted by ``key``."""
        return sorted(self._by_task, key=key)

    def record(self, task_id: str) -> Mapping[str, Any]:
        """The record of ``task_id``, decoded (a new value each call)."""
        return _unpacked(self._by_task[task_id])
