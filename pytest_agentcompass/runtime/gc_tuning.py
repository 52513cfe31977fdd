"""Garbage collection while thousands of tasks finish: rarer, for a while."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["fewer_collections", "settle_and_freeze"]


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect less often inside the block; the previous thresholds come back after it.

    Every finished task leaves long-lived objects (outcomes, reports); with
    the default thresholds that triggers a full collection every few hundred
    tasks over an ever larger heap. The young generation is collected less
    often too: with hundreds of tasks in flight, each of its collections walks
    their live coroutines and frames again (+0.3 s of CPU for 10,000 tasks at
    500 at a time), and building 10,000 outcomes from their detail files at
    the end of an xdist run paid the same; the plugin makes few cycles. Not rarer
    than every 5,000 allocations: at 50,000 (1.5% fewer instructions per no-op
    task) a ``run_task`` that keeps a caught exception in a local, a cycle
    through its frame, kept each task's buffer alive until the collection,
    and 3,000 tasks with 1 MB each peaked at 672 MB instead of 154 MB
    (docs/performance.md, set P).
    """
    thresholds = gc.get_threshold()
    if thresholds[0] == 0:  # automatic collection is off (the user's choice): leave it off
        yield
        return
    gc.set_threshold(max(thresholds[0], 5_000), thresholds[1], max(thresholds[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def settle_and_freeze(rounds: int) -> None:
    """Collect until a collection finds nothing (at most ``rounds`` times), then freeze what is left.

    For the end of a session: pytest collects five times over the whole heap
    before it reports the exceptions raised in finalizers
    (``_pytest/unraisableexception.py``), and after 10,000 tasks that heap is
    the items, reports and junit elements the session still holds (0.9 s of
    CPU). What survives a collection that found nothing is alive, so it is
    frozen (``gc.freeze``): pytest's collections then walk only what is made
    after this, and still find every finalizer this one did not run. The
    caller unfreezes once pytest has collected, or nothing is ever collected
    again in that process.
    """
    for _ in range(rounds):
        if not gc.collect():
            break
    gc.freeze()
