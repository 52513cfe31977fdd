"""Process-wide concurrency primitives every layer above uses.

:mod:`.limits` (named capacity and rate limits, run-wide under xdist through
:mod:`.permits`), :mod:`.threads` (the pool behind ``asyncio.to_thread``),
:mod:`.flock` (cross-process file locks) and :mod:`.shield` (cleanup a
cancellation cannot interrupt). They import nothing of the package, so
providers, models and the gateway use them without loading the runtime.
"""
