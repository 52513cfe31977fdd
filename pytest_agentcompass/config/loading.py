"""Loading a config file: YAML, ``${VAR}`` expansion, and every error as ``file:line: yaml.path: message``.

Every validation error is reported that way, so a user can jump straight to
the offending key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..vocabulary.errors import ConfigError
from .schema import Orchestration
from .yaml_text import format_loc, read_yaml

__all__ = ["RENAMED_REQUEST_KEYS", "VARIABLE", "LoadedConfig", "expand_variables", "format_loc", "load_config"]

#: Keys of a request with a new name -> that name. The old one is read until 0.3.0, with a warning.
RENAMED_REQUEST_KEYS = {"reuse": "carry_over"}

#: ``${NAME}``, ``${NAME:-default}`` (the default applies when ``NAME`` is not set, as in
#: Harbor's task files), ``${NAME:?message}`` (not set: an error that says ``message``), and
#: ``$${...}``: the text ``${...}`` itself, not a variable.
VARIABLE = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-?])([^}]*))?\}")


def expand_variables(text: str, environ: Mapping[str, str]) -> tuple[str, list[str], list[str]]:
    """``text`` with every ``${NAME}`` / ``${NAME:-default}`` / ``${NAME:?message}`` filled from
    ``environ``, and every ``$${...}`` written as ``${...}``.

    :returns: the text, the values read from ``environ`` (a default written in
        the file is none of them), and the names that are not set and have no
        default (each left as an empty string), a ``:?`` one as ``NAME (message)``.
    """
    text, read, missing = _expand_text(text, environ)
    return text, [value for _, value in read], missing


def _expand_text(text: str, environ: Mapping[str, str]) -> tuple[str, list[tuple[str, str]], list[str]]:
    """:func:`expand_variables`, with each value read named by its variable."""
    read: list[tuple[str, str]] = []
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        escaped, name, form, word = match.groups()
        if escaped:
            return match.group(0)[1:]
        if name in environ:
            read.append((name, environ[name]))
            return environ[name]
        if form == ":-":
            return word
        missing.append(f"{name} ({word})" if form == ":?" and word else name)
        return ""

    return VARIABLE.sub(substitute, text), read, missing


#: Words that make a variable, or the config key it fills, hold a secret.
SECRET_WORDS = re.compile(r"key|token|secret|passw|passphrase|credential|auth|cookie|private|signature|cert", re.I)
#: Keys whose values go to an agent or over HTTP as they are (a harness's env, extra headers).
SECRET_MAPPINGS = frozenset({"env", "headers"})
#: A URL with a user or password in it (``https://user:pass@proxy``).
URL_USERINFO = re.compile(r"://[^/@\s]+@")


def is_secret(name: str, loc: tuple[Any, ...], value: str) -> bool:
    """Whether ``value``, read from variable ``name`` into the config key at ``loc``, is masked.

    A variable or key named like a credential (``OPENAI_API_KEY``, ``api_key``,
    ``GH_TOKEN``), anything under a harness's ``env`` or ``headers``, and a URL
    with credentials are; a model name, a mode or a path is not, so that the
    run's records still say which one ran.
    """
    keys = [k for k in loc if isinstance(k, str)]
    return bool(
        SECRET_WORDS.search(name)
        or any(SECRET_WORDS.search(k) or k in SECRET_MAPPINGS for k in keys)
        or URL_USERINFO.search(value)
    )


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and what is needed to write it back safely."""

    path: Path
    orchestration: Orchestration
    secrets: frozenset[str] = field(default_factory=frozenset)
    #: The YAML paths whose value came from a ``${VAR}``: masked whole in every record of the config.
    secret_paths: frozenset[tuple[Any, ...]] = field(default_factory=frozenset)
    #: Line of every YAML path, for errors found after loading (component params).
    lines: Mapping[tuple[Any, ...], int] = field(default_factory=dict)
    #: One ``file:line: ...`` line per key given under its old name (the pytest face warns with them).
    deprecations: tuple[str, ...] = ()

    @property
    def directory(self) -> Path:
        """Relative paths in the config (``output_dir``, ``file.py:Class``, path params) start here."""
        return self.path.parent

    @property
    def output_root(self) -> Path:
        root = Path(self.orchestration.output_dir)
        return root if root.is_absolute() else self.directory / root

    def validation_error(self, loc: tuple[Any, ...], exc: ValidationError) -> ConfigError:
        """``exc`` (raised validating the value at ``loc``) as a config error with file and line."""
        return ConfigError(_format_validation(self.path, exc, self.lines, prefix=loc, hidden=self.secret_paths))

    def error_at(self, loc: tuple[Any, ...], message: str) -> ConfigError:
        return ConfigError(f"{self.path}:{_closest_line(loc, self.lines)}: {format_loc(loc)}: {message}")

    def redacted_dump(self) -> dict[str, Any]:
        """The resolved config: every field a ``${VAR}`` was expanded into is ``***``, and long
        secret values are masked inside any other text."""
        from ..vocabulary.redact import MASK, Redactor

        dump = self.orchestration.model_dump(mode="json")
        for path in self.secret_paths:
            holder: Any = dump
            for key in path[:-1]:
                try:
                    holder = holder[key]
                except (KeyError, IndexError, TypeError):
                    break
            else:
                if isinstance(holder, dict | list) and _has(holder, path[-1]):
                    holder[path[-1]] = MASK
        return Redactor(self.secrets).apply(dump, whole_values=True)  # type: ignore[no-any-return]


def _has(holder: dict[Any, Any] | list[Any], key: Any) -> bool:
    return key in holder if isinstance(holder, dict) else isinstance(key, int) and 0 <= key < len(holder)


def load_config(path: str | os.PathLike[str], environ: dict[str, str] | None = None) -> LoadedConfig:
    """Read, expand and validate a config file.

    :raises ConfigError: with one line per problem, each naming file, line and key.
    """
    file = Path(path)
    data, lines = read_yaml(file)
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the config must be a mapping with a 'requests' list")
    secrets: set[str] = set()
    secret_paths: set[tuple[Any, ...]] = set()
    problems: list[tuple[tuple[Any, ...], str]] = []
    data = _expand(data, (), environ if environ is not None else dict(os.environ), secrets, problems, secret_paths)
    if problems:
        raise ConfigError("\n".join(f"{file}:{lines.get(loc, 1)}: {msg}" for loc, msg in problems))
    deprecations = _renamed_keys(file, data, lines)
    _check_request_names(file, data, lines)
    try:
        orchestration = Orchestration.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(file, exc, lines, hidden=secret_paths)) from None
    _check_model_params(file, orchestration, lines, secret_paths)
    return LoadedConfig(file, orchestration, frozenset(secrets), frozenset(secret_paths), lines, tuple(deprecations))


def _renamed_keys(file: Path, data: dict[str, Any], lines: dict[tuple[Any, ...], int]) -> list[str]:
    """Rename each request key given under its old name (:data:`RENAMED_REQUEST_KEYS`), in place.

    :returns: what to warn about, one ``file:line: ...`` each.
    :raises ConfigError: when a request gives both names.
    """
    said: list[str] = []
    requests = data.get("requests")
    for index, request in enumerate(requests if isinstance(requests, list) else []):
        for old, new in RENAMED_REQUEST_KEYS.items():
            if not isinstance(request, dict) or old not in request:
                continue
            loc = ("requests", index, old)
            where = f"{file}:{_closest_line(loc, lines)}: {format_loc(loc)}"
            if new in request:
                raise ConfigError(f"{where}: give {new} only ({old} is its old name)")
            request[new] = request.pop(old)
            lines.update({(*loc[:-1], new, *key[3:]): line for key, line in list(lines.items()) if key[:3] == loc})
            said.append(f"{where} is now {new} (the same values); the old name stops working in 0.3.0")
    return said


def _check_model_params(
    file: Path,
    orchestration: Orchestration,
    lines: Mapping[tuple[Any, ...], int],
    hidden: Collection[tuple[Any, ...]] = (),
) -> None:
    """``model.params`` at load, like every other key (not at the first model call, after a run
    directory was made). Which schema applies depends on the harness, whose class is only imported
    when the request is built (where it is checked again, exactly): here a value must fit one of
    the two the built-ins read, the in-process client's or the model gateway's."""
    messages: list[str] = []
    for index, request in enumerate(orchestration.requests):
        if request.model is None:
            continue
        # Imported on first use: two more pydantic models (a few ms) that a run without a model never needs.
        from .model_params import GatewaySettings, ModelSettings

        failures: list[ValidationError] = []
        for schema in (ModelSettings, GatewaySettings):
            try:
                schema.model_validate(request.model.params)
                break
            except ValidationError as exc:
                failures.append(exc)
        else:  # neither fits: the one the value comes closest to says what is wrong
            closest = min(failures, key=lambda exc: exc.error_count())
            messages += _validation_lines(
                file, closest, lines, prefix=("requests", index, "model", "params"), hidden=hidden
            )
    if messages:
        raise ConfigError("invalid agentcompass config:\n" + "\n".join(messages))


def _format_validation(
    file: Path,
    exc: ValidationError,
    lines: Mapping[tuple[Any, ...], int],
    prefix: tuple[Any, ...] = (),
    hidden: Collection[tuple[Any, ...]] = (),
) -> str:
    return "invalid agentcompass config:\n" + "\n".join(_validation_lines(file, exc, lines, prefix, hidden))


def _validation_lines(
    file: Path,
    exc: ValidationError,
    lines: Mapping[tuple[Any, ...], int],
    prefix: tuple[Any, ...] = (),
    hidden: Collection[tuple[Any, ...]] = (),
) -> list[str]:
    """One ``file:line: path: message`` per problem, in the file's order; ``hidden`` are the
    paths whose value came from a secret, never echoed."""
    found = []
    for error in exc.errors():
        loc = prefix + tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        line = _closest_line(loc, lines)
        msg = "unknown key" if error["type"] == "extra_forbidden" else error["msg"] + _given(error, loc, hidden)
        found.append((line, f"{file}:{line}: {format_loc(loc)}: {msg}"))
    return [message for _, message in sorted(found, key=lambda pair: pair[0])]


def _given(error: Mapping[str, Any], loc: tuple[Any, ...], hidden: Collection[tuple[Any, ...]]) -> str:
    """``, got 'jurnal'``: the value a message is about, when it is a short scalar the user typed
    (a typo is found faster beside what was expected). Nothing for a missing key, a mapping or a
    list (the message names the key), a value from a secret, or one where a credential goes."""
    given = error.get("input")
    if error["type"] == "missing" or not isinstance(given, str | int | float | bool):
        return ""
    if any(loc[: len(path)] == path for path in hidden):  # from a secret ${VAR}
        return ""
    if is_secret("", loc, str(given)):  # typed in, but where a credential goes (a key, a header, a URL's password)
        return ""
    shown = repr(given)
    return f", got {shown}" if len(shown) <= 60 else ""


def _check_request_names(file: Path, data: Mapping[str, Any], lines: Mapping[tuple[Any, ...], int]) -> None:
    """A request name given twice, named where it is (the schema's own check knows no line)."""
    requests = data.get("requests")
    first: dict[str, int] = {}
    for index, request in enumerate(requests if isinstance(requests, list) else ()):
        name = request.get("name") if isinstance(request, dict) else None
        if not isinstance(name, str):
            continue
        line = _closest_line(("requests", index, "name"), lines)
        if name in first:
            raise ConfigError(
                f"{file}:{line}: requests[{index}].name: duplicate request name {name!r} (first on line {first[name]})"
            )
        first[name] = line


def _closest_line(loc: tuple[Any, ...], lines: Mapping[tuple[Any, ...], int]) -> int:
    # A missing key has no line of its own: point at the nearest parent that exists.
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def _expand(
    value: Any,
    loc: tuple[Any, ...],
    environ: dict[str, str],
    secrets: set[str],
    problems: list[tuple[tuple[Any, ...], str]],
    paths: set[tuple[Any, ...]],
) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, (*loc, k), environ, secrets, problems, paths) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, (*loc, i), environ, secrets, problems, paths) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    text, read, missing = _expand_text(value, environ)
    for name in missing:
        problems.append((loc, f"{format_loc(loc)}: environment variable {name} is not set"))
    hidden = [v for name, v in read if v and is_secret(name, loc, v)]
    if hidden:
        # Masked whole in the recorded config; a field filled from defaults alone is no secret.
        paths.add(loc)
        secrets.update(hidden)
    return text
