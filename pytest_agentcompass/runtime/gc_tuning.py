"""Garbage collection while thousands of tasks finish: rarer, for a while."""

from __future__ import annotations

import atexit
import contextlib
import gc
import sys
from collections.abc import Iterator

__all__ = ["collect_until_clean", "fewer_collections", "skip_exit_collections"]

#: Whether :func:`skip_exit_collections` registered its handler in this process.
_skipping_at_exit = False


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


def collect_until_clean(iterations: int) -> None:
    """Collect garbage until a collection finds nothing, at most ``iterations`` times.

    What pytest does at the end of a session, ``iterations`` (five) times over the whole
    heap, to report the exceptions finalizers raise
    (``_pytest/unraisableexception.py``, whose ``gc_collect_harder`` this
    stands in for: the same signature). A collection that finds nothing runs
    no finalizer, so it makes no new garbage, and every later one would find
    nothing either: stopping there finds what the fixed count finds. After
    10,000 tasks the heap is the items, reports and junit elements the session
    still holds, and each full collection of it costs 0.17 s of CPU; this
    stops after two instead of five.
    """
    for _ in range(iterations):
        if not gc.collect():
            return


def skip_exit_collections() -> None:
    """Once per process: at the interpreter's exit, leave the heap to the operating system.

    For a process that ends with its session (the plugin decides which:
    ``plugin/__init__.py``). After the session pytest has collected garbage
    already (above); what is left is reachable, and the interpreter's exit
    would still walk it, more than once, and free it object by object:
    0.6-0.7 s after 10,000 tasks (or 10,000 plain tests), with nothing printed
    meanwhile. Under xdist the controller waits that long for each worker to
    end. ``gc.freeze()`` at exit moves every object out of the collector's
    reach, so the walks find nothing; memory goes back with the process.
    What differs: an object in a reference cycle that is still alive at exit
    is not finalized (Python does not promise that it is), so a file such an
    object left open is not flushed. Under ``python -X dev`` the exit collects
    as usual (resource warnings are what that mode is for).
    """
    global _skipping_at_exit
    if _skipping_at_exit or sys.flags.dev_mode:
        return
    _skipping_at_exit = True
    atexit.register(gc.freeze)  # atexit runs before the interpreter's last collections
