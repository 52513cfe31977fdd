"""Whether a component's lifecycle methods take what the runtime passes them, checked when its request is built.

Without this, a ``run_task(self, task, env)`` failed every task of the run at
its inference stage, each with a ``TypeError`` that did not say what the
method should take. The base classes' own signatures are the contract: the
runtime passes their required parameters by position and the ones with a
default by name (``evaluate(..., env=env)``), so an override is checked by
binding that call to it, without calling anything.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from ..vocabulary.errors import ComponentError

__all__ = ["check_lifecycle_methods"]


def _call_shape(function: types.FunctionType) -> tuple[list[str], list[str]]:
    """The runtime's call of a base class method: (parameters it passes by position, by name)."""
    positional: list[str] = []
    named: list[str] = []
    for parameter in list(inspect.signature(function).parameters.values())[1:]:  # after self
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        (positional if parameter.default is parameter.empty else named).append(parameter.name)
    return positional, named


def check_lifecycle_methods(component: Any, bases: tuple[type, ...], kind: str, ref: str, where: str) -> None:
    """Raise :class:`ComponentError` for an override of a method of ``bases`` that cannot take the runtime's call.

    ``kind`` and ``ref`` name the component as the config does (``benchmark 'bm.py:B'``), ``where`` its key.
    """
    cls = type(component)
    # A method replaced on the instance (``self.run_task = ...`` in ``__init__``) is what the runtime calls.
    own = getattr(component, "__dict__", {})
    for base in cls.__mro__:
        if base not in bases:
            continue
        for name, declared in vars(base).items():
            if name.startswith("_") or not isinstance(declared, types.FunctionType):
                continue
            static = inspect.getattr_static(cls, name, declared)
            if name not in own and (static is declared or isinstance(static, property)):
                # Not overridden; or a property, whose getter may need what only a run sets up.
                continue
            positional, named = _call_shape(declared)
            try:
                method = getattr(component, name)
                # What the runtime calls, not what a decorator's ``functools.wraps`` points back to:
                # a wrapper that supplies an argument of its own takes fewer than the function it wraps.
                signature = inspect.signature(method, follow_wrapped=False)
            except Exception:  # a descriptor or callable inspect cannot read: left to the call itself
                continue
            try:
                signature.bind(*positional, **dict.fromkeys(named))
            except TypeError as exc:
                call = ", ".join([*positional, *(f"{n}={n}" for n in named)])
                raise ComponentError(
                    f"{kind} {ref!r} ({where}): {cls.__name__}.{name}{signature} cannot take what the runtime"
                    f" passes it, {name}({call}): {exc}"
                ) from None
