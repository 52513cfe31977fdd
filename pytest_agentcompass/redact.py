"""Secret redaction for everything the run store writes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["Redactor"]

MASK = "***"


class Redactor:
    """Replaces known secret values (``${VAR}`` expansions) wherever they appear.

    Longer secrets are replaced first so one secret that contains another is
    masked whole.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def apply(self, value: Any) -> Any:
        if not self._secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.apply(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.apply(v) for v in value]
        if not isinstance(value, int | float | bool) and value is not None:
            # Anything else (a dataclass, an enum) is made JSON-ready first so it is redacted too.
            from .types import to_jsonable

            converted = to_jsonable(value)
            return converted if converted is value else self.apply(converted)
        return value
