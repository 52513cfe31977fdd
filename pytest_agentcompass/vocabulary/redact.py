"""Secret redaction for everything the run store and the reports write.

A ``${VAR}`` expansion of the config that looks like a credential is a secret
(``config.loading.is_secret``), and so is a value a
harness learns at run time (:func:`add_runtime_secret`, e.g. an API key read
from the process environment). A value of at least :data:`MIN_SECRET_LENGTH`
characters is masked wherever it appears, inside any text. A shorter one
(``1``, ``true``, a port) would also match run ids, task ids, ``pass@1`` and
ordinary words, so it is masked only as a whole value: in the config fields it
was expanded into, and wherever a recorded value equals it exactly
(``whole_values=True``). Short runtime values are placeholders
(``api_key: none`` for a local server) and are not masked at all.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["MIN_SECRET_LENGTH", "Redactor", "SecretLogFilter", "add_runtime_secret"]

MASK = "***"
#: Secrets shorter than this are masked as whole values only, never inside other text.
MIN_SECRET_LENGTH = 8

#: Output caps cut text anywhere, a secret too: a piece of one at least this long
#: is masked where text was cut, that is where it is not followed (for what
#: begins a secret) or preceded (for what ends one) by a letter or digit:
#: the text's edge, a line's, a quote. A secret that merely shares a prefix
#: with other text (``https://``) goes on with a letter there, and is kept.
FRAGMENT = 6

_lock = threading.Lock()
_runtime: frozenset[str] = frozenset()


def add_runtime_secret(value: str) -> None:
    """Mask ``value`` in everything written from now on, in this process."""
    global _runtime
    if len(value) < MIN_SECRET_LENGTH or value in _runtime:
        return
    with _lock:
        _runtime = _runtime | {value}


def _escaped_too(secrets: Iterable[str]) -> set[str]:
    """``secrets``, and each as JSON writes it inside a string (an error that quotes a JSON payload)."""
    forms: set[str] = set()
    for secret in secrets:
        forms.update((secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]))
    return forms


class Redactor:
    """Replaces known secret values wherever they appear.

    Longer secrets are replaced first so one secret that contains another is
    masked whole.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if s}
        self._whole = frozenset(values)
        self._own = frozenset(s for s in values if len(s) >= MIN_SECRET_LENGTH)
        self._seen: frozenset[str] | None = None
        self._all: list[str] = []

    @property
    def _secrets(self) -> list[str]:
        runtime = _runtime
        if runtime is not self._seen:  # runtime secrets were added: merge once
            self._seen = runtime
            self._all = sorted(_escaped_too(self._own | runtime), key=len, reverse=True)
        return self._all

    def __bool__(self) -> bool:
        return bool(self._whole or _runtime)

    def forms(self) -> list[str]:
        """Every secret masked inside text now (its own and the runtime ones), JSON-escaped forms too."""
        return list(self._secrets)

    def may_occur_in(self, value: Any) -> bool:
        """Whether a secret may occur anywhere in ``value`` (a cheap test before a deep :meth:`apply`).

        One JSON dump at C speed; conservative (True) for a secret that JSON
        would escape, which a search of the dump could miss.
        """
        secrets = self._secrets
        if not secrets:
            return False
        if any(not secret.isprintable() or '"' in secret or "\\" in secret for secret in secrets):
            return True
        blob = json.dumps(value, ensure_ascii=False, default=str)
        # A piece a cut left behind starts or ends like the secret (see :meth:`text`).
        return any(secret[:FRAGMENT] in blob or secret[-FRAGMENT:] in blob for secret in secrets)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
            if secret[:FRAGMENT] in value or secret[-FRAGMENT:] in value:
                value = _mask_cut_fragments(value, secret)
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


class SecretLogFilter(logging.Filter):
    """Masks runtime secrets in the records of the logger it is attached to (HTTP client loggers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _runtime:
            message = record.getMessage()
            masked = Redactor().text(message)
            if masked != message:
                record.msg, record.args = masked, None
        return True


def _mask_cut_fragments(value: str, secret: str) -> str:
    """Mask the pieces of ``secret`` that a cut left in ``value`` (see :data:`FRAGMENT`)."""
    head, size = secret[:FRAGMENT], len(secret)
    start = value.find(head)
    while start != -1:
        end, matched = start + FRAGMENT, FRAGMENT
        while end < len(value) and matched < size and value[end] == secret[matched]:
            end, matched = end + 1, matched + 1
        if end == len(value) or not value[end].isalnum():
            value = value[:start] + MASK + value[end:]
            end = start + len(MASK)
        start = value.find(head, end)
    tail = secret[-FRAGMENT:]
    end = value.find(tail)
    while end != -1:
        stop = end + FRAGMENT
        begin, matched = end, FRAGMENT
        while begin > 0 and matched < size and value[begin - 1] == secret[size - matched - 1]:
            begin, matched = begin - 1, matched + 1
        if begin == 0 or not value[begin - 1].isalnum():
            value = value[:begin] + MASK + value[stop:]
            stop = begin + len(MASK)
        end = value.find(tail, stop)
    return value
