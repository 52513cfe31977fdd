"""Short tracebacks: only the frames of user code, cheap enough for many failures."""

from __future__ import annotations

import traceback
from pathlib import Path

__all__ = ["format_trace"]

_PACKAGE = str(Path(__file__).resolve().parent.parent)
# pytest's and pluggy's frames too: an error in load_tasks happens under collection.
_SKIP = (_PACKAGE, "/asyncio/", "/contextlib.py", "/_pytest/", "/pluggy/")
_MAX_FRAMES = 12


def format_trace(exc: BaseException) -> str:
    """The traceback of ``exc`` without this plugin's and asyncio's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_SKIP[0])]
    frames = [f for f in frames if not any(s in f.filename for s in _SKIP[1:])][-_MAX_FRAMES:]
    if not frames:  # raised by the plugin itself: its message says it all, a bare header would repeat it
        return ""
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines.extend(traceback.format_exception_only(type(exc), exc))
    return "".join(lines).rstrip()
