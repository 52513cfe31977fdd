"""Blocking calls (``asyncio.to_thread``): enough threads for the run, and none that outlive the grace."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from pytest_agentcompass.concurrency import threads
from pytest_agentcompass.concurrency.threads import BlockingCallPool, drain_shared_pools, run_with_pool, shared_pool


def test_every_queued_call_gets_its_own_thread() -> None:
    pool = BlockingCallPool(64, grace=1)
    barrier = threading.Barrier(30, timeout=10)  # breaks unless 30 calls block at the same time
    futures = [pool.submit(barrier.wait) for _ in range(30)]
    assert sorted(f.result() for f in futures) == list(range(30))
    pool.shutdown()
    assert pool.abandoned == []


def test_idle_workers_stay_for_the_next_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    # A long linger: only a worker woken for nothing and leaving could start a third thread.
    monkeypatch.setattr("pytest_agentcompass.concurrency.threads.IDLE_SECONDS", 60.0)
    pool = BlockingCallPool(64, grace=1)
    for _ in range(20):
        barrier = threading.Barrier(2, timeout=10)  # each round needs two threads at once
        futures = [pool.submit(barrier.wait) for _ in range(2)]
        assert sorted(f.result() for f in futures) == [0, 1]
    assert pool.started == 2
    pool.shutdown()
    assert pool.abandoned == []


def test_a_shared_pool_is_drained_without_closing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = shared_pool(4, "test-shared")
    release = threading.Event()
    held = pool.submit(release.wait)
    assert drain_shared_pools(0.0) == ["threading.Event.wait"]  # still running: named, not waited for
    # The call ends only once the drain below waits for it.
    draining = threading.Event()
    wait = pool._drained.wait
    monkeypatch.setattr(pool._drained, "wait", lambda timeout=None: (draining.set(), wait(timeout))[1])
    releaser = threading.Thread(target=lambda: (draining.wait(30), release.set()))
    releaser.start()
    assert drain_shared_pools(30.0) == []  # returns once the call is done
    releaser.join()
    assert held.result() is True
    assert pool.submit(int, "7").result() == 7  # still open for the next run


def test_errors_reach_the_caller_and_idle_threads_exit() -> None:
    pool = BlockingCallPool(4, grace=1)
    with pytest.raises(ValueError, match="invalid literal"):
        pool.submit(int, "x").result()
    pool.shutdown()
    for thread in [t for t in threading.enumerate() if t.name.startswith("agentcompass-io")]:
        thread.join(10)  # a guard against a hang: idle threads exit once the pool is shut down
    assert not [t for t in threading.enumerate() if t.name.startswith("agentcompass-io")]


def test_calls_for_a_loop_each_settle_their_own_waiter_whatever_wakes_the_loop() -> None:
    """``call_for``: calls that end while the loop is busy settle on one wake-up of the loop
    (counted here through its ``call_soon_threadsafe``), and each its own waiter: results,
    errors, a call whose awaiting task was cancelled meanwhile, and calls still queued when the
    pool shuts down cancelling them (their waiters are cancelled)."""
    pool = BlockingCallPool(4, grace=1)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        wakeups = []
        threadsafe = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *args: (wakeups.append(args), threadsafe(*args))[1]  # type: ignore[method-assign]
        gate = threading.Event()
        first = pool.call_for(loop, lambda: gate.wait(10))  # holds the workers back while the rest queue
        calls = [pool.call_for(loop, (lambda i=i: i if i % 7 else int("x"))) for i in range(1, 400)]
        calls.append(pool.call_for(loop, lambda: next(iter([]))))  # a StopIteration no future takes as is
        abandoned = pool.call_for(loop, lambda: "late")
        abandoned.waiter.cancel()  # its task was cancelled: what the call returns later goes nowhere
        gate.set()
        deadline = time.monotonic() + 30
        while not all(c.done() for c in (first, *calls, abandoned)):  # the loop does not run meanwhile
            assert time.monotonic() < deadline
            time.sleep(0.005)
        settled = await asyncio.gather(first.waiter, *(c.waiter for c in calls), return_exceptions=True)
        assert settled[0] is True
        refused = settled.pop()
        assert isinstance(refused, RuntimeError) and isinstance(refused.__cause__, StopIteration), refused
        for i, outcome in enumerate(settled[1:], start=1):
            if i % 7:
                assert outcome == i
            else:
                assert isinstance(outcome, ValueError) and "invalid literal" in str(outcome)
        assert len(wakeups) == 1, len(wakeups)  # 401 calls ended while the loop was busy: one wake-up
        blocker = threading.Event()
        held = [pool.call_for(loop, lambda: blocker.wait(10)) for _ in range(4)]
        while len(pool.in_flight()) < 4:  # every worker inside a call: the next one stays queued
            await asyncio.sleep(0.01)
        queued = pool.call_for(loop, lambda: "never")
        pool.shutdown(wait=False, cancel_futures=True)
        with pytest.raises(asyncio.CancelledError):
            await queued.waiter
        blocker.set()
        assert await asyncio.gather(*(h.waiter for h in held)) == [True] * 4

    asyncio.run(main())
    pool.shutdown()
    assert pool.abandoned == []


def test_a_run_with_sync_calls_leaves_its_loop_and_pool_to_the_collector() -> None:
    """What hands a loop its calls' outcomes must not keep the loop (nor, through the registry of
    pools by loop, the pool) alive once the run is over."""
    import gc
    import weakref

    from pytest_agentcompass.concurrency import threads
    from pytest_agentcompass.runtime.user_code import call_user

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one() -> int:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return int(await call_user(int, "7"))

    assert [run_with_pool(one(), max_workers=4, grace=1) for _ in range(3)] == [7, 7, 7]
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]
    assert not any(ref() in threads._LOOP_POOLS for ref in loops)


def test_shutdown_waits_within_the_grace_then_abandons_and_names_the_call() -> None:
    pool = BlockingCallPool(4, grace=0.3)
    release = threading.Event()
    pool.submit(release.wait)
    started = time.monotonic()
    pool.shutdown(wait=True)
    assert 0.25 <= time.monotonic() - started < 5
    assert pool.abandoned == ["threading.Event.wait"]
    stuck = [t for t in threading.enumerate() if t.name.startswith("agentcompass-io")]
    assert stuck and all(t.daemon for t in stuck), "an abandoned call must not keep the interpreter alive"
    release.set()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(time.sleep, 0)


def blocking_call(loop: asyncio.AbstractEventLoop, running: asyncio.Future[None], release: threading.Event) -> None:
    """Says it runs, then blocks until released."""
    loop.call_soon_threadsafe(running.set_result, None)
    release.wait()


def test_to_thread_uses_the_pool_and_is_named_by_its_function() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        running: asyncio.Future[None] = loop.create_future()
        release = threading.Event()
        task = asyncio.ensure_future(asyncio.to_thread(blocking_call, loop, running, release))
        await running
        pool = loop._default_executor
        assert isinstance(pool, BlockingCallPool)
        seen = pool.in_flight()
        release.set()
        await task
        return seen

    assert run_with_pool(main(), max_workers=4, grace=1) == [f"{__name__}.blocking_call"]


BLOCKING = """
import asyncio, threading
from pytest_agentcompass import BaseBenchmark, BaseHarness, RunResult, TaskSpec

N = 24
BARRIER = threading.Barrier(N, timeout=20)

class Many(BaseBenchmark):
    def load_tasks(self, req):
        return [TaskSpec(f"t{i}") for i in range(N)]
    def evaluate(self, task, prepared, result, req, plan, env=None):
        return RunResult(task.task_id, output=result.output, score=1.0)

class Together(BaseHarness):
    async def run(self, session, task, prepared, env, req, plan):
        # Like an SDK call that streams for the whole task: all N must hold a thread at once.
        await asyncio.to_thread(BARRIER.wait)
        return RunResult(task.task_id, output="ok")

class Hung(BaseHarness):
    async def run(self, session, task, prepared, env, req, plan):
        await asyncio.to_thread(threading.Event().wait)  # never returns, ignores cancellation
        return RunResult(task.task_id, output="never")
"""


def _config(pytester: pytest.Pytester, harness: str, extra: str = "") -> None:
    pytester.makepyfile(blocking=BLOCKING)
    pytester.makefile(
        ".yaml",
        agentcompass=f"output_dir: runs\ntask_concurrency: 24\n{extra}requests:\n"
        f"  - name: r\n    benchmark: {{id: 'blocking.py:Many'}}\n    harness: {{id: 'blocking.py:{harness}'}}\n",
    )


def test_blocking_calls_of_every_active_task_run_at_once(pytester: pytest.Pytester) -> None:
    _config(pytester, "Together")
    result = pytester.runpytest_subprocess("--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=24)


def test_a_hung_blocking_call_does_not_hang_pytest(pytester: pytest.Pytester) -> None:
    _config(pytester, "Hung", "timeout_seconds: 1\ncleanup_grace_seconds: 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--agentcompass=agentcompass.yaml", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=120,  # the stock executor joins its threads at exit: this would never return
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "orchestration timeout" in proc.stdout
    assert (
        "24 blocking call(s) still running after the cleanup grace were abandoned "
        "(daemon threads, they end with the process): threading.Event.wait" in proc.stdout
    )


def test_an_abandoned_call_does_not_hold_a_place_in_the_pool() -> None:
    """Calls no one waits for any more still run, but the next calls get threads of their own."""
    pool = BlockingCallPool(2, grace=1)
    gate = threading.Event()

    async def main() -> str:
        loop = asyncio.get_running_loop()
        hung = [pool.call_for(loop, lambda: gate.wait(30)) for _ in range(2)]
        deadline = time.monotonic() + 10
        while len(pool.in_flight()) < 2:  # both run, and fill the pool
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        for call in hung:
            call.waiter.cancel()  # their stage timed out
            pool.abandon(call)
        quick = pool.call_for(loop, lambda: "served")
        return str(await asyncio.wait_for(quick.waiter, 10))

    try:
        assert asyncio.run(main()) == "served"
        assert pool._max_workers == 4  # two more while the abandoned calls run
    finally:
        gate.set()
        pool.shutdown(wait=True, timeout=10)
    assert pool._max_workers == 2 and not pool._given_up


def test_abandoned_calls_get_threads_of_their_own_up_to_a_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each hung call keeps a thread: past the bound, later calls wait for one again, and that is said once."""
    monkeypatch.setattr(threads, "MAX_ABANDONED", 1)
    pool = BlockingCallPool(1, grace=1)
    gate = threading.Event()

    async def main() -> tuple[bool, str]:
        loop = asyncio.get_running_loop()
        first = pool.call_for(loop, lambda: gate.wait(30))
        while not pool.in_flight():
            await asyncio.sleep(0.01)
        pool.abandon(first)  # within the bound: the next call gets a thread
        second = pool.call_for(loop, lambda: gate.wait(30))
        while len(pool.in_flight()) < 2:
            await asyncio.sleep(0.01)
        pool.abandon(second)  # past it: said, and no thread more
        pool.abandon(second)
        third = pool.call_for(loop, lambda: "served")
        await asyncio.sleep(0.3)
        waited = not third.done()
        gate.set()  # the hung calls end: the third is served on a thread they free
        return waited, str(await asyncio.wait_for(third.waiter, 10))

    try:
        assert asyncio.run(main()) == (True, "served")
    finally:
        gate.set()
        pool.shutdown(wait=True, timeout=10)
    said = [r.getMessage() for r in caplog.records if "outlived their timeout" in r.getMessage()]
    assert said == [
        "1 calls that outlived their timeout still hold threads: later calls wait for one of them to end "
        "(their stages may time out waiting)"
    ]
    assert pool._max_workers == 1 and not pool._given_up
