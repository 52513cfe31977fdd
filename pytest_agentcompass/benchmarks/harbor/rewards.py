"""Harbor's reward files: ``reward.txt`` (one number) or ``reward.json`` (named numbers).

Anything unusable is an evaluation error naming what and why, never a 0 and
never silence: no file, an empty one, a word, a file too large to be a
reward, a number outside the task set's reward range. ``reward.json``
entries that cannot be named numbers (an empty or odd key, a word, a
boolean) are ignored, each with a note saying which and why.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["REWARD_FILES", "REWARD_MAX_BYTES", "RewardError", "Rewards", "check_range", "parse_rewards"]

REWARD_FILES = ("reward.txt", "reward.json")
#: A reward file larger than this is no reward (a verifier writes a number, or a few named ones).
REWARD_MAX_BYTES = 1024 * 1024
#: A ``reward.json`` key usable as a metric name (in the summary, the HTML report, baselines).
_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$")
#: A number as a verifier writes one: ASCII digits, a point, an exponent. Python's ``float()`` also
#: takes ``0_1``, other scripts' digits (U+0661, Arabic-Indic one) and ``infinity``: none of them is a reward.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


class RewardError(ValueError):
    """The verifier left no usable reward."""


@dataclass(frozen=True)
class Rewards:
    """A verifier's verdict: the task ``score``, every named number it reported, and what was ignored."""

    score: float
    values: Mapping[str, float] = field(default_factory=dict)
    source: str = "reward.txt"
    #: ``reward.json`` entries left out, each "<key>: <why>".
    ignored: tuple[str, ...] = ()
    #: ``reward.txt`` as written (quoted in messages as the verifier wrote it).
    written: str = ""


def parse_rewards(txt: bytes | None, js: bytes | None, key: str | None = None) -> Rewards:
    """Read ``reward.txt`` (preferred, as Harbor does) or ``reward.json``.

    ``reward.json``'s score is ``key`` when given, else its ``reward`` entry,
    else (no such entry at all) the mean of its numbers. A score entry that is
    there but no finite number (``NaN``, a word) is an error naming it.

    :raises RewardError: naming what is missing or malformed (and what was ignored).
    """
    if txt is not None:
        text = txt.decode("utf-8", "replace").strip()
        if not text:
            raise RewardError("reward.txt is empty")
        if not _DECIMAL.fullmatch(text):
            raise RewardError(
                f"reward.txt holds {_cut(text)!r}, not a number (plain decimal or exponent notation, ASCII digits)"
            )
        value = float(text)
        if not math.isfinite(value):  # 1e999
            raise RewardError(f"reward.txt holds {_cut(text)!r}, not a finite number")
        return Rewards(value, {"reward": value}, written=text)
    if js is None:
        raise RewardError("the verifier wrote neither /logs/verifier/reward.txt nor /logs/verifier/reward.json")
    try:
        data = json.loads(js.decode("utf-8", "replace") or "null")
    except json.JSONDecodeError as exc:
        raise RewardError(f"reward.json is not JSON: {exc}") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise RewardError(f"reward.json is not usable JSON: {_cut(str(exc))}") from None
    except RecursionError:  # "[[[[..." a hundred thousand deep: the parser's recursion, not a traceback
        raise RewardError("reward.json nests too deeply to be read (an object of named numbers is flat)") from None
    if not isinstance(data, Mapping):
        raise RewardError(f"reward.json must hold an object of named numbers, not {type(data).__name__}")
    values, ignored = _named_numbers(data)
    said = f" (ignored: {'; '.join(ignored)})" if ignored else ""
    # The entry that is the score must be a usable number itself: a NaN (or a word) there is the
    # verifier's verdict gone wrong, not a reason to score the mean of the other entries instead.
    wanted = key if key is not None else "reward"
    if wanted in data and wanted not in values:
        raise RewardError(
            f"reward.json's {wanted!r} is {_cut(repr(data[wanted]), 40)}, not a finite number; "
            "it is the score, so the task cannot be scored"
        )
    if key is not None:
        if key not in values:
            raise RewardError(f"reward.json has no number named {key!r} (the benchmark's reward_key){said}")
        return Rewards(values[key], values, "reward.json", tuple(ignored))
    if "reward" in values:
        return Rewards(values["reward"], values, "reward.json", tuple(ignored))
    if not values:
        raise RewardError(f"reward.json holds no usable numbers{said}")
    return Rewards(sum(values.values()) / len(values), values, "reward.json", tuple(ignored))


def _named_numbers(data: Mapping[str, object]) -> tuple[dict[str, float], list[str]]:
    values: dict[str, float] = {}
    ignored: list[str] = []
    for name, value in data.items():
        shown = _cut(repr(name), 40)
        if not _KEY.match(str(name)):
            ignored.append(f"{shown}: not usable as a metric name (letters, digits, '_', '.', ':', '-')")
        elif isinstance(value, bool) or not isinstance(value, int | float):
            ignored.append(f"{shown}: {_cut(repr(value), 40)} is not a number")
        elif isinstance(value, int) and abs(value) > 2**1023:  # no float holds it (float() overflows)
            ignored.append(f"{shown}: an integer of {len(str(abs(value)))} digits is not a finite number")
        elif not math.isfinite(value):
            ignored.append(f"{shown}: {value!r} is not a finite number")
        else:
            values[str(name)] = float(value)
    return values, ignored


def check_range(rewards: Rewards, bounds: tuple[float, float] | None) -> None:
    """:raises RewardError: naming every reward outside ``bounds`` (``None``: no range)."""
    if bounds is None:
        return
    low, high = bounds
    if rewards.written:  # reward.txt: its one number, as written
        outside = [repr(_cut(rewards.written))] if not low <= rewards.score <= high else []
    else:
        outside = [f"{name} = {value!r}" for name, value in rewards.values.items() if not low <= value <= high]
        if not low <= rewards.score <= high and not outside:
            outside.append(f"score = {rewards.score!r}")
    if outside:
        raise RewardError(
            f"{rewards.source} holds {', '.join(outside)}, outside the reward range [{low:g}, {high:g}] "
            "(the benchmark's reward_range)"
        )


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
