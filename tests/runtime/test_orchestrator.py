"""Scheduling semantics of the Orchestrator, driven directly with a recorder (no pytest in between)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_agentcompass import (
    ComponentRef,
    EnvironmentSpec,
    ExecutionSpec,
    HarnessFreeBenchmark,
    LocalEnvironment,
    RunRequest,
    RunResult,
    TaskSpec,
)
from pytest_agentcompass.concurrency.limits import CapacityPermits, capacity_for, rate_limiter_for, reset_limits
from pytest_agentcompass.runtime import Orchestrator, Planner, RequestRuntime, RunStore
from pytest_agentcompass.runtime.context import RequestContext
from pytest_agentcompass.runtime.strategies import STRATEGIES

Log = list[tuple[str, str, float]]


class Recorder(HarnessFreeBenchmark):
    def __init__(
        self,
        log: Log,
        name: str,
        delays: list[float],
        fail_first: set[str] | None = None,
        until: dict[str, Callable[[], bool]] | None = None,
    ) -> None:
        super().__init__()
        self.log, self.name, self.delays = log, name, delays
        self.fail_first = set(fail_first or ())
        #: task -> a condition it runs until (an event, not a duration: the machine may be slow).
        self.until = dict(until or {})

    def load_tasks(self, req: RunRequest) -> list[TaskSpec]:
        return [TaskSpec(f"{self.name}{i}") for i in range(len(self.delays))]

    async def run_task(self, task: TaskSpec, prepared: Any, env: Any, req: Any, plan: Any) -> RunResult:
        self.log.append(("start", task.task_id, time.monotonic()))
        await asyncio.sleep(self.delays[int(task.task_id[len(self.name) :])])
        condition = self.until.get(task.task_id)
        for _ in range(6000):  # a guard against a hang, not a measurement
            if condition is None or condition():
                break
            await asyncio.sleep(0.01)
        self.log.append(("end", task.task_id, time.monotonic()))
        if task.task_id in self.fail_first:
            self.fail_first.discard(task.task_id)
            raise ConnectionError("flaky")  # transient: retried by default
        return RunResult(task.task_id, output="ok")

    def evaluate(self, task: TaskSpec, prepared: Any, result: RunResult, req: Any, plan: Any, env: Any = None) -> Any:
        return dataclasses.replace(result, score=1.0)


@pytest.fixture(autouse=True)
def _fresh_limits() -> Any:
    reset_limits()
    yield
    reset_limits()


def make_state(
    tmp_path: Path, bench: Recorder, env: dict[str, Any] | None = None, execution: dict[str, Any] | None = None
) -> RequestRuntime:
    req = RunRequest(
        name=bench.name,
        benchmark=ComponentRef(id="recorder"),
        environment=EnvironmentSpec(**{"params": {"base_dir": str(tmp_path)}, **(env or {})}),
        execution=ExecutionSpec(**{"retry_backoff_seconds": 0, **(execution or {})}),
    )
    provider = LocalEnvironment(req.environment)
    ctx = RequestContext(
        req=req,
        benchmark=bench,
        harness=None,
        provider=provider,
        planner=Planner(req, bench, provider),
        strategy=STRATEGIES["avg"],
        store=RunStore(tmp_path / "runs" / bench.name),
        capacity=capacity_for(req.environment.id, req.environment.capacity),
        run_id="run",
        fingerprint="fp",
    )
    tasks = bench.load_tasks(req)
    return RequestRuntime(ctx, tasks, {t.task_id for t in tasks}, config_dump={})


def orchestrate(
    states: list[RequestRuntime], workers: int, events: Log | None = None, **kwargs: Any
) -> tuple[Orchestrator, Log]:
    events = [] if events is None else events

    def on_event(event: str, state: RequestRuntime) -> None:
        events.append((event, state.name, time.monotonic()))
        if event == "open":
            events.append(("pending-before", ",".join(str(len(s.pending)) for s in states), time.monotonic()))

    orchestrator = Orchestrator(states, task_concurrency=workers, on_event=on_event, **kwargs)
    asyncio.run(orchestrator.execute())
    return orchestrator, events


def starts(log: Log) -> list[str]:
    return [task for kind, task, _ in log if kind == "start"]


def started(log: Log) -> set[tuple[str, str]]:
    return {(kind, task) for kind, task, _ in log}


def test_declaration_order_priority_with_overlap(tmp_path: Path) -> None:
    log: Log = []
    # a1 runs until b0 has started: that b0 can start while a1 runs is what is tested.
    a = Recorder(log, "a", [0.05, 0.0, 0.05, 0.05], until={"a1": lambda: ("start", "b0") in started(log)})
    b = Recorder(log, "b", [0.05, 0.05, 0.05])
    orchestrate([make_state(tmp_path, a), make_state(tmp_path, b)], workers=2)
    order = starts(log)
    assert order[:4] == ["a0", "a1", "a2", "a3"]  # all of a is dispatched before any of b
    assert set(order[4:]) == {"b0", "b1", "b2"}
    events = [(kind, task) for kind, task, _ in log]
    # A later request overlaps active tasks of an earlier one (else a1 would have waited out its guard).
    assert events.index(("start", "b0")) < events.index(("end", "a1"))


def test_not_round_robin(tmp_path: Path) -> None:
    log: Log = []
    states = [make_state(tmp_path, Recorder(log, n, [0.01] * 5)) for n in ("a", "b", "c")]
    orchestrate(states, workers=3)
    order = starts(log)
    assert [t[0] for t in order] == sorted(t[0] for t in order)


def test_runs_are_opened_pipelined(tmp_path: Path) -> None:
    log: Log = []
    a = Recorder(log, "a", [0.05] * 10)
    b = Recorder(log, "b", [0.05] * 2)
    _, events = orchestrate([make_state(tmp_path, a), make_state(tmp_path, b)], workers=3)
    opens = [e for e in events if e[0] == "open"]
    assert [e[1] for e in opens] == ["a", "b"]
    pending_a_when_b_opens = int(
        next(e for e in events if e[0] == "pending-before" and e[2] >= opens[1][2])[1].split(",")[0]
    )
    assert pending_a_when_b_opens < 3
    first_b = next(t for kind, task, t in log if kind == "start" and task.startswith("b"))
    assert opens[1][2] <= first_b


def test_finalization_waits_for_earlier_pending_but_not_their_active_tasks(tmp_path: Path) -> None:
    log: Log = []
    events: Log = []
    # a0 runs until b is finalized: that b can be, while a0 runs, is what is tested.
    a = Recorder(log, "a", [0.0, 0.05, 0.05], until={"a0": lambda: ("finalized", "b") in started(events)})
    b = Recorder(log, "b", [0.05])
    orchestrate([make_state(tmp_path, a), make_state(tmp_path, b)], workers=3, events=events)
    finalized = {name: t for kind, name, t in events if kind == "finalized"}
    a0_end = next(t for kind, task, t in log if kind == "end" and task == "a0")
    assert finalized["b"] <= a0_end <= finalized["a"]  # b finalizes while a0 is still active


def test_a_request_with_nothing_pending_waits_for_earlier_pending(tmp_path: Path) -> None:
    log: Log = []
    a = Recorder(log, "a", [0.1] * 4)
    empty = Recorder(log, "e", [])
    _, events = orchestrate([make_state(tmp_path, a), make_state(tmp_path, empty)], workers=1)
    finalized = {name: t for kind, name, t in events if kind == "finalized"}
    last_a_start = max(t for kind, task, t in log if kind == "start")
    assert finalized["e"] >= last_a_start


@pytest.mark.parametrize("capacity", [1, 3])
def test_capacity_is_never_exceeded(tmp_path: Path, capacity: int) -> None:
    log: Log = []
    states = [make_state(tmp_path, Recorder(log, n, [0.05] * 6), env={"capacity": capacity}) for n in ("a", "b")]
    orchestrate(states, workers=8)
    depth = peak = 0
    for kind, _, _ in sorted(log, key=lambda e: (e[2], e[0] == "start")):
        depth += 1 if kind == "start" else -1
        peak = max(peak, depth)
    assert peak == capacity
    assert capacity_for("local", 0).peak == capacity


def test_capacity_zero_is_unlimited(tmp_path: Path) -> None:
    log: Log = []
    orchestrate([make_state(tmp_path, Recorder(log, "a", [0.1] * 6), env={"capacity": 0})], workers=6)
    assert capacity_for("local", 0).peak == 6


def test_whole_attempt_retry_releases_and_reacquires_the_permit(tmp_path: Path) -> None:
    log: Log = []
    bench = Recorder(log, "a", [0.05, 0.05], fail_first={"a0"})
    orchestrate([make_state(tmp_path, bench, env={"capacity": 1}, execution={"max_retries": 1})], workers=2)
    # a0 fails, gives its permit to the waiting a1, and queues again behind it.
    assert starts(log) == ["a0", "a1", "a0"]


def test_open_qps_spaces_environment_opens(tmp_path: Path) -> None:
    log: Log = []
    state = make_state(tmp_path, Recorder(log, "a", [0.0] * 8), env={"open_qps": 20})
    before = time.monotonic()
    orchestrate([state], workers=8)
    started = [t for kind, _, t in log if kind == "start"]
    # 20 opens per second: the limiter gives the 8th open a slot 7 x 50 ms after
    # the first, which came after ``before``, and a task starts after its open.
    # Only a lower bound: a busy machine makes it later, never earlier (gaps
    # between starts are not checked: a loop that wakes late starts several
    # tasks whose slots have passed at once).
    assert len(started) == 8
    assert max(started) - before >= 7 * 0.05 - 0.001


def test_qps_zero_is_unlimited() -> None:
    async def main() -> float:
        limiter = rate_limiter_for("unlimited", 0)
        started = time.monotonic()
        for _ in range(1000):
            await limiter.wait()
        return time.monotonic() - started

    assert asyncio.run(main()) < 1.0


def test_two_event_loops_share_one_capacity() -> None:
    permits = CapacityPermits(1)
    holding = 0
    peak = 0
    lock = threading.Lock()

    async def hold() -> None:
        nonlocal holding, peak
        for _ in range(5):
            async with permits.permit():
                with lock:
                    holding += 1
                    peak = max(peak, holding)
                await asyncio.sleep(0.01)
                with lock:
                    holding -= 1

    threads = [threading.Thread(target=asyncio.run, args=(hold(),)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert peak == 1 and permits.in_use == 0


def test_cancelled_waiter_does_not_leak_a_permit() -> None:
    async def main() -> int:
        permits = CapacityPermits(1)
        await permits.acquire()
        waiter = asyncio.ensure_future(permits.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        permits.release()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0)
        return permits.in_use

    assert asyncio.run(main()) == 0


def test_deadline_cancels_and_records_unfinished(tmp_path: Path) -> None:
    log: Log = []
    state = make_state(tmp_path, Recorder(log, "a", [0.05, 30, 30, 0.05]))
    orchestrator, _ = orchestrate([state], workers=2, timeout_seconds=0.5, cleanup_grace_seconds=5)
    assert orchestrator.result.status == "timeout"
    assert sorted(o.task.task_id for o in orchestrator.result.unfinished) == ["a1", "a2", "a3"]
    info = state.store.read_run_info()
    assert info["status"] == "timeout" and sorted(info["unfinished_tasks"]) == ["a1", "a2", "a3"]
    assert list(tmp_path.glob("agentcompass-*")) == []  # workspaces of cancelled attempts are gone


def test_stop_lets_running_tasks_finish(tmp_path: Path) -> None:
    log: Log = []
    state = make_state(tmp_path, Recorder(log, "a", [0.2, 0.2, 0.2, 0.2]))
    orchestrator = Orchestrator([state], task_concurrency=2)

    async def main() -> None:
        task = asyncio.ensure_future(orchestrator.execute())
        await asyncio.sleep(0.1)
        orchestrator.stop("maxfail")
        await task

    asyncio.run(main())
    assert starts(log) == ["a0", "a1"]
    assert sorted(state.outcomes) == ["a0", "a1"]
    assert state.store.read_run_info()["status"] == "stopped"
