"""Calling user code that may be sync or async, without blocking the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import signal
import threading
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..vocabulary.errors import UserBaseException, UserExit

if TYPE_CHECKING:
    from ..concurrency.threads import LoopCall

__all__ = ["call_user", "maybe_await"]

log = logging.getLogger("pytest_agentcompass")


async def maybe_await(value: Any) -> Any:
    """Await ``value`` if it is awaitable, else return it."""
    if inspect.isawaitable(value):
        return await value
    return value


@functools.cache
def _inline() -> frozenset[Any]:
    """The base classes' own defaults: they return at once, so a thread would only cost time."""
    from ..benchmarks.base import BaseBenchmark
    from ..harnesses.base import BaseHarness

    names = {
        BaseBenchmark: ("make_benchmark_plan", "adjust_plan", "prepare_task", "collect_artifacts"),
        BaseHarness: ("preflight", "adjust_input", "start_session", "close_session", "aclose"),
    }
    return frozenset(getattr(base, name) for base, names_ in names.items() for name in names_)


#: Whether a plain function is a coroutine function, asked once per function
#: (three lifecycle methods per task; ``inspect`` takes microseconds each time).
_ASYNC: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _is_async(fn: Callable[..., Any]) -> bool:
    target = getattr(fn, "__func__", fn)  # a bound method is async if its function is
    if type(target) is types.FunctionType:
        known = _ASYNC.get(target)
        if known is None:
            known = _ASYNC[target] = inspect.iscoroutinefunction(target)
        return known
    # iscoroutinefunction sees through functools.partial; an object with
    # ``async def __call__`` needs the second look.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def call_user(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call a lifecycle method (benchmark, harness, analyzer) that may be sync or async.

    A coroutine function runs on the loop. Anything else runs in a worker
    thread (the loop's default executor, the run's blocking-call pool), so a
    sync ``run_task`` that sleeps or calls an SDK leaves other tasks running,
    and a stage timeout still ends the stage: the thread cannot be
    interrupted, so it is abandoned, said so here, and listed again at the end
    of the session if it is still running. A sync function returning an
    awaitable has it awaited on the loop.

    ``sys.exit()`` and ``KeyboardInterrupt`` in ``fn`` become :class:`UserExit`:
    let through, they would end the event loop itself (see :func:`_escaped`).
    Any other ``BaseException`` that is not a cancellation of the calling
    task becomes :class:`UserBaseException`.
    """
    try:
        if _is_async(fn):  # the common case, awaited here: one coroutine less per call (three calls per task)
            return await fn(*args, **kwargs)
        return await _call(fn, *args, **kwargs)
    except (SystemExit, KeyboardInterrupt) as exc:
        # With the user's frames: the trace shows where the exit was called.
        raise _escaped(fn, exc).with_traceback(exc.__traceback__) from exc
    except asyncio.CancelledError as exc:
        current = asyncio.current_task()
        if current is None or current.cancelling():
            raise  # the task is being cancelled (a timeout, the deadline, a Ctrl-C): it ends as such
        # Raised by fn itself (it awaited something it cancelled, or raised it): to asyncio the task
        # would look cancelled, and it would end with no result and no report.
        raise _foreign(fn, exc).with_traceback(exc.__traceback__) from exc
    except Exception:
        raise
    except BaseException as exc:  # GeneratorExit, a class of the benchmark's own: would end the loop
        raise _foreign(fn, exc).with_traceback(exc.__traceback__) from exc


def _name(fn: Callable[..., Any]) -> str:
    """How messages name a lifecycle method: ``B.run_task``, or the callable's type."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _foreign(fn: Callable[..., Any], exc: BaseException) -> UserBaseException:
    name = _name(fn)
    detail = f": {exc}" if str(exc) else ""
    return UserBaseException(
        f"{name} raised {type(exc).__name__}{detail} (a BaseException, not an Exception): the task fails"
    )


#: Loops whose run a task's ``KeyboardInterrupt`` has already interrupted.
_INTERRUPTED: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _escaped(fn: Callable[..., Any], exc: SystemExit | KeyboardInterrupt) -> UserExit:
    """What ``fn`` raising ``exc`` means for the run, as pytest treats the same in a test.

    asyncio re-raises both out of the loop from whichever task raised them:
    every task would stop at once, unrecorded. ``sys.exit()`` fails this one
    task instead; a ``KeyboardInterrupt`` interrupts the run the way Ctrl-C
    does, through the SIGINT handler in place (the run's, or xdist's worker).
    """
    name = _name(fn)
    if isinstance(exc, SystemExit):
        return UserExit(f"{name} called sys.exit({exc.code!r}): the task fails, the run goes on")
    loop = asyncio.get_running_loop()
    # Once per loop: each further SIGINT would count as another Ctrl-C (the second
    # skips the cleanup grace, the third leaves at once) when several tasks raise it.
    if loop not in _INTERRUPTED and signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.SIG_DFL, None):
        _INTERRUPTED.add(loop)
        # To the main thread, where Python runs signal handlers: raised in this one (an
        # xdist worker's loop thread), it would wait for the main thread's next wake-up.
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
    return UserExit(f"{name} raised KeyboardInterrupt: the run is interrupted, as by Ctrl-C")


async def _call(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """A ``fn`` that is not a coroutine function: inline when it is a base class default, else in a worker thread."""
    if getattr(fn, "__func__", None) in _inline():
        return await maybe_await(fn(*args, **kwargs))
    loop = asyncio.get_running_loop()
    # Named by the pool after ``fn`` (not Context.run) if it must be abandoned.
    work = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    # Here, not at the top: the runtime imports this module, and importing the
    # runtime package from it first would be a cycle (this path hops a thread anyway).
    from ..concurrency.threads import pool_of

    pool = pool_of(loop)
    call: asyncio.Future[Any] | LoopCall
    if pool is None:  # a loop of someone else's: its default executor
        executed = loop.run_in_executor(None, work)
        call, waiter = executed, asyncio.shield(executed)
    else:
        # The plugin's own loops: one loop future settled from the worker,
        # not run_in_executor's two chained futures plus a shield around
        # them (a sync lifecycle method is a hand-off per task).
        call = pool.call_for(loop, work)
        waiter = call.waiter
    try:
        result = await waiter
    except asyncio.CancelledError:
        if not call.done():
            if pool is not None:  # then call is the pool's LoopCall
                pool.abandon(cast("LoopCall", call))  # its thread no longer counts against the pool's size
            name = _name(fn)
            log.warning("%s is still running in a worker thread: it cannot be interrupted and was abandoned", name)
        raise
    return await maybe_await(result)
