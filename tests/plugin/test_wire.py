"""Several events in one message (``plugin/wire.py``): what the pytester runs under ``-n`` cannot
time on purpose, a second thread's event while the main thread holds its own.

The end to end behaviour (every report replayed in order, ``--dist worksteal``
answered, a lost worker's task explained) is in ``test_xdist.py``; these pin the
thread and size rules of the two functions.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pytest_agentcompass.plugin.keys import EVENTS
from pytest_agentcompass.plugin.wire import MESSAGE_TEXT, sent_together, unpack_events


class Interactor:
    """What ``sent_together`` uses of xdist's ``WorkerInteractor``: its ``sendevent``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def sendevent(self, name: str, **kwargs: Any) -> None:
        self.sent.append((name, kwargs))


def report(index: int, text: str = "") -> dict[str, Any]:
    return {"data": {"nodeid": f"t{index}", "longrepr": text, "sections": []}, "item_index": index}


def on_another_thread(interactor: Interactor, name: str) -> None:
    thread = threading.Thread(target=lambda: interactor.sendevent(name, indices=[]))
    thread.start()
    thread.join()


def test_the_main_threads_events_go_as_one_message_and_other_threads_at_once() -> None:
    interactor = Interactor()
    with sent_together(interactor):
        interactor.sendevent("testreport", **report(0))
        on_another_thread(interactor, "unscheduled")  # execnet's receiver answering "steal"
        interactor.sendevent("testreport", **report(1))
        assert interactor.sent == [("unscheduled", {"indices": []})]
    assert interactor.sent[1] == (EVENTS, {"events": [("testreport", report(0)), ("testreport", report(1))]})
    on_another_thread(interactor, "unscheduled")  # after the block: the interactor's own method again
    assert interactor.sent[2:] == [("unscheduled", {"indices": []})]


def test_one_event_goes_as_xdist_sends_it_and_held_events_go_when_the_block_raises() -> None:
    interactor = Interactor()
    with sent_together(interactor):
        interactor.sendevent("logstart", nodeid="t0")
    assert interactor.sent == [("logstart", {"nodeid": "t0"})]
    with pytest.raises(KeyboardInterrupt), sent_together(interactor):
        interactor.sendevent("logstart", nodeid="t1")
        interactor.sendevent("logfinish", nodeid="t1")
        raise KeyboardInterrupt
    assert interactor.sent[1] == (EVENTS, {"events": [("logstart", {"nodeid": "t1"}), ("logfinish", {"nodeid": "t1"})]})


def test_long_reports_go_before_the_message_grows_past_its_budget() -> None:
    interactor = Interactor()
    long = "x" * (MESSAGE_TEXT // 2 + 1)
    with sent_together(interactor):
        for index in range(5):
            interactor.sendevent("testreport", **report(index, long))
    sizes = [len(kwargs["events"]) if name == EVENTS else 1 for name, kwargs in interactor.sent]
    assert sizes == [2, 2, 1]
    order = [event[1]["item_index"] for name, kwargs in interactor.sent for event in kwargs.get("events", [])]
    order += [kwargs["item_index"] for name, kwargs in interactor.sent if name != EVENTS]
    assert order == [0, 1, 2, 3, 4]


class Node:
    """What ``unpack_events`` uses of xdist's ``WorkerController``."""

    def __init__(self) -> None:
        self.workerinput: dict[str, Any] = {}
        self.received: list[Any] = []
        self._down = False

    def process_from_remote(self, eventcall: Any) -> None:
        self.received.append(eventcall)
        if eventcall[0] == "workerfinished":
            self._down = True


def test_the_controller_hands_each_event_to_xdist_in_order_until_the_node_is_down() -> None:
    node = Node()
    unpack_events(node)
    assert node.workerinput[EVENTS] is True
    node.process_from_remote(("logstart", {"nodeid": "t0"}))
    node.process_from_remote(
        (EVENTS, {"events": [["testreport", {"n": 1}], ["workerfinished", {}], ["testreport", {"n": 2}]]})
    )
    assert node.received == [("logstart", {"nodeid": "t0"}), ("testreport", {"n": 1}), ("workerfinished", {})]
