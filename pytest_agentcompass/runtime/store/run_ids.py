"""Run ids and timestamps: what naming a run needs, without the store's writers (configuration names the run)."""

from __future__ import annotations

import datetime as _dt
import secrets

__all__ = ["new_run_id", "now"]


def now() -> str:
    """A UTC timestamp with microseconds: two runs in one second still order."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")


def new_run_id() -> str:
    """``<UTC time to the microsecond>-<random>``: sorts by creation time, unique across processes."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    return f"{stamp}-{secrets.token_hex(2)}"
