"""Validating a harness's ``params`` against its ``params_model``.

Assembly validates params when the component declares a model; validating
again here keeps a harness safe when it is built directly (tests, older
assembly) and costs one pydantic call per request.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..vocabulary.errors import ComponentError

__all__ = ["parse_harness_params"]

M = TypeVar("M", bound=BaseModel)


def parse_harness_params(model: type[M], params: dict[str, Any], harness: str) -> M:
    """:raises ComponentError: one line per problem, each naming ``harness.params.<key>``."""
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        problems = [
            f"harness {harness!r}: harness.params.{'.'.join(str(p) for p in e['loc'])}: "
            + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, "))
            for e in exc.errors()
        ]
        raise ComponentError("\n".join(problems)) from None
