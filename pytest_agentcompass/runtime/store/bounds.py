"""What one stored field may hold: long text is cut in the middle, and the cut is said.

A model that answers 50 MB would otherwise make a run directory of hundreds
of megabytes per task (the detail, its attempts, the trajectory). Every text
value of a per-task record (detail, retry detail, checkpoint, a JSON
artifact such as the trajectory) keeps at most ``limit`` characters: its
head and its tail, with a marker in place of the middle. The record lists
what was cut (``truncated_fields``: path -> original length).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...config import MAX_STORED_CHARS
from ...vocabulary.types import to_jsonable

__all__ = [
    "DEFAULT_FIELD_LIMIT",
    "RECORD_FIELDS",
    "TRUNCATED_KEY",
    "bound_fields",
    "cut_note",
    "fitted_limit",
    "same_as_task",
]

#: Characters kept per text field; configurable per request (``execution.max_stored_chars``).
DEFAULT_FIELD_LIMIT = MAX_STORED_CHARS
#: The key under which a record lists its cut fields.
TRUNCATED_KEY = "truncated_fields"
#: A whole record keeps the text of at most this many fields at the limit: past that, its
#: fields are cut shorter (a metadata of a thousand fields, each under the limit, was unbounded).
RECORD_FIELDS = 4
#: Characters a field keeps however many fields a record has.
_FLOOR = 100
#: Result fields an attempt's entry in a detail does not repeat when they equal the task's.
_SHARED_FIELDS = ("output", "error", "artifacts", "metadata")


def _marker(omitted: int, limit: int) -> str:
    return f"\n[... {omitted} characters not stored: a stored field keeps {limit} (execution.max_stored_chars) ...]\n"


def bound_fields(value: Any, limit: int) -> tuple[Any, dict[str, int]]:
    """``value`` with every text longer than ``limit`` characters cut to its head and tail.

    Containers are copied only along the paths that changed. Returns the value
    and ``{dotted path: original length}`` of each cut field.
    """
    cuts: dict[str, int] = {}
    return _bound(value, limit, "", cuts), cuts


def _bound(value: Any, limit: int, path: str, cuts: dict[str, int]) -> Any:
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        cuts[path or "<value>"] = len(value)
        half = limit // 2
        return value[:half] + _marker(len(value) - 2 * half, limit) + value[len(value) - half :]
    if isinstance(value, Mapping):
        out = {k: _bound(v, limit, f"{path}.{k}" if path else str(k), cuts) for k, v in value.items()}
        return value if all(out[k] is value[k] for k in value) else out
    if isinstance(value, list | tuple):
        items = [_bound(v, limit, f"{path}[{i}]", cuts) for i, v in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if value is None or isinstance(value, int | float | bool | bytes):
        return value
    converted = to_jsonable(value)  # a dataclass, an enum: as it will be written
    return value if converted is value else _bound(converted, limit, path, cuts)


def fitted_limit(value: Any, limit: int) -> int:
    """The characters per field that keep the text of ``value`` near ``RECORD_FIELDS * limit``.

    ``limit`` when it fits; else the largest per-field limit (at least
    ``_FLOOR``) under which the fields' text adds up to that total: the long
    fields are cut, the short ones kept whole.
    """
    lengths: list[int] = []
    _lengths(value, lengths)
    total = RECORD_FIELDS * limit
    if sum(min(n, limit) for n in lengths) <= total:
        return limit
    low, high = _FLOOR, limit  # the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if sum(min(n, middle) for n in lengths) <= total:
            low = middle
        else:
            high = middle - 1
    return low


def _lengths(value: Any, into: list[int]) -> None:
    if isinstance(value, str):
        into.append(len(value))
    elif isinstance(value, Mapping):
        for item in value.values():
            _lengths(item, into)
    elif isinstance(value, list | tuple):
        for item in value:
            _lengths(item, into)


def cut_note(cuts: Mapping[str, int], limit: int, configured: int | None = None) -> str:
    """One line for a record's notes (the detail's notes reach the terminal report and the HTML page).

    ``configured``: ``execution.max_stored_chars`` when ``limit`` is lower (the record was too large as a whole).
    """
    shown = list(cuts.items())
    fields = ", ".join(f"{path} ({length} characters)" for path, length in shown[:20])
    if len(shown) > 20:
        fields += f" and {len(shown) - 20} more"
    why = "execution.max_stored_chars"
    if configured is not None and limit < configured:
        why = f"a record keeps about {RECORD_FIELDS} x execution.max_stored_chars = {RECORD_FIELDS * configured}"
    return f"stored with fields cut to {limit} characters ({why}): {fields}"


def same_as_task(detail: Mapping[str, Any]) -> dict[str, Any]:
    """``detail`` whose attempt entries do not repeat what equals the task's own result.

    With one attempt (the usual case) the task's result is that attempt's:
    its output would be stored twice. A field left out of an entry is named
    in its ``same_as_task`` list.
    """
    attempts = detail.get("attempt_results")
    if not isinstance(attempts, Mapping):
        return dict(detail)
    compact: dict[str, Any] = {}
    for index, entry in attempts.items():
        if not isinstance(entry, Mapping):
            compact[index] = entry
            continue
        same = [f for f in _SHARED_FIELDS if entry.get(f) not in (None, "", {}, []) and _within(f, entry, detail)]
        kept = {k: v for k, v in entry.items() if k not in same}
        compact[index] = {**kept, "same_as_task": same} if same else kept
    return {**detail, "attempt_results": compact}


def _within(name: str, entry: Mapping[str, Any], detail: Mapping[str, Any]) -> bool:
    """Whether the task's ``name`` holds the entry's: equal, or for ``metadata`` each of its keys with
    the same value (the task's metadata adds its own keys, ``attempts`` and ``attempt_scores``)."""
    mine, task = entry.get(name), detail.get(name)
    if mine == task:
        return True
    if name != "metadata" or not isinstance(mine, Mapping) or not isinstance(task, Mapping):
        return False
    return all(key in task and task[key] == value for key, value in mine.items())
