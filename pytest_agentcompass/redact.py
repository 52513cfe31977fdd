"""Secret redaction for everything the run store and the reports write.

Every ``${VAR}`` expansion of the config is a secret. A value of at least
:data:`MIN_SECRET_LENGTH` characters is masked wherever it appears, inside
any text. A shorter one (``1``, ``true``, a port) would also match run ids,
task ids, ``pass@1`` and ordinary words, so it is masked only as a whole
value: in the config fields it was expanded into, and wherever a recorded
value equals it exactly (``whole_values=True``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["Redactor"]

MASK = "***"
#: Secrets shorter than this are masked as whole values only, never inside other text.
MIN_SECRET_LENGTH = 8


class Redactor:
    """Replaces known secret values (``${VAR}`` expansions) wherever they appear.

    Longer secrets are replaced first so one secret that contains another is
    masked whole.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s}
        self._whole = frozenset(values)
        self._secrets = sorted((s for s in values if len(s) >= MIN_SECRET_LENGTH), key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._whole)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def apply(self, value: Any, *, whole_values: bool = False) -> Any:
        """``value`` with secrets masked; ``whole_values`` also masks strings equal to a short secret."""
        if not self._secrets and not whole_values:
            return value
        if isinstance(value, str):
            return MASK if whole_values and value in self._whole else self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.apply(v, whole_values=whole_values) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.apply(v, whole_values=whole_values) for v in value]
        if not isinstance(value, int | float | bool) and value is not None:
            # Anything else (a dataclass, an enum) is made JSON-ready first so it is redacted too.
            from .types import to_jsonable

            converted = to_jsonable(value)
            return converted if converted is value else self.apply(converted, whole_values=whole_values)
        return value
