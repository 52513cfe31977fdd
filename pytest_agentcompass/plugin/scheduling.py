"""How items reach xdist workers when they run tasks concurrently.

xdist's ``load`` scheduler keeps a few items per worker, because its worker
loop runs one at a time. A worker running the plugin's concurrent loop needs
as many tasks in hand as it may run at once, or the run-wide
``task_concurrency`` is never reached. This scheduler is ``load`` with a
deeper queue: every worker is kept at ``depth`` items (twice the run-wide
concurrency, so one worker alone could use every permit) and topped up in
batches as reports come back. It never waits for a worker to finish
anything before sending it work: the concurrent loop has no one-item
lookahead to starve, and the order of items (declaration order of requests)
is kept because each worker's batch is the next slice of the collection.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScheduling  # type: ignore[import-untyped]

__all__ = ["TaskScheduling"]


class TaskScheduling(LoadScheduling):  # type: ignore[misc]
    """``--dist load`` with a queue of ``depth`` items per worker."""

    # What this class uses of ``LoadScheduling``'s state.
    collection: list[str] | None
    pending: list[int]
    node2pending: dict[Any, list[int]]
    node2collection: dict[Any, list[str]]

    def __init__(self, config: pytest.Config, log: Any, *, depth: int) -> None:
        super().__init__(config, log)
        self.depth = max(2, depth)
        # Top up once a quarter of the queue is done: fewer, larger messages.
        self.low = max(1, self.depth - max(1, self.depth // 4))

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # a replacement worker joined: fill it like the rest
            for node in self.nodes:
                self.check_schedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        collection = self.collection = next(iter(self.node2collection.values()))
        self.pending[:] = range(len(collection))
        if not collection:
            return
        # Round-robin batches, so every worker starts at the front of the collection.
        batch = max(1, min(self.depth, len(self.pending) // max(1, len(self.nodes))))
        while self.pending and any(len(self.node2pending[n]) < self.depth for n in self.nodes):
            for node in self.nodes:
                self._send_tests(node, min(batch, self.depth - len(self.node2pending[node])))
        if not self.pending:
            for node in self.nodes:
                node.shutdown()

    def check_schedule(self, node: Any, duration: float = 0) -> None:
        if node.shutting_down:
            return
        if self.pending:
            held = len(self.node2pending[node])
            if held <= self.low:
                self._send_tests(node, self.depth - held)
        else:
            node.shutdown()
