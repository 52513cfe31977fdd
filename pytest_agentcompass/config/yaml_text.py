"""A config file's YAML: its text read, and every problem YAML itself has located by line.

What ``loading`` builds on: the data, and the line of every key and item
(``yaml.path -> line``), once the text is readable UTF-8, valid YAML, gives
no key twice in a mapping, and its aliases do not expand past what a config
needs. Every problem is one ``ConfigError`` line that names the file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ..vocabulary.errors import ConfigError

__all__ = ["MAX_CONFIG_VALUES", "format_loc", "read_yaml"]


def read_yaml(file: Path) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """The data of ``file`` and the line of each of its paths (``("requests", 0, "name") -> 3``).

    :raises ConfigError: the file cannot be read, is not UTF-8, not valid YAML, gives a key twice,
        or its aliases expand too far.
    """
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read agentcompass config {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = _text_line(file.read_bytes(), exc.start)
        raise ConfigError(
            f"{file}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x}); save it as UTF-8"
        ) from None
    try:
        # The nodes, composed apart from the load: constructing the data flattens merge keys (``<<``)
        # into their mapping node, where they would read as keys given twice.
        node = yaml.compose(text)
        if node is not None:
            _check_size(file, node)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_problem(file, text, exc)) from None
    except RecursionError:
        raise ConfigError(f"{file}: invalid YAML: nested too deeply to read") from None
    if node is None:
        return data, {}
    duplicates = list(_duplicate_keys(node, ()))
    if duplicates and isinstance(data, dict):
        raise ConfigError(
            "invalid agentcompass config:\n"
            + "\n".join(
                f"{file}:{line}: {format_loc(loc)}: key given twice (first on line {first})"
                for loc, line, first in duplicates
            )
        )
    return data, dict(_node_lines(node, ()))


def format_loc(loc: tuple[Any, ...]) -> str:
    """``('requests', 1, 'execution')`` -> ``requests[1].execution``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _text_line(data: bytes | str, offset: int) -> int:
    """The 1-based line of ``offset`` (a byte of ``data``, or a character of its text) in ``data``."""
    return data.count(b"\n" if isinstance(data, bytes) else "\n", 0, offset) + 1  # type: ignore[arg-type]


def _yaml_problem(file: Path, text: str, exc: yaml.YAMLError) -> str:
    """``exc`` as one line that names the file and line, as every other config problem does
    (PyYAML's own text names the input ``"<unicode string>"`` and a 0-based column on a line of its own)."""
    if isinstance(exc, yaml.reader.ReaderError):
        # A control character: PyYAML says only its offset in the whole text.
        line = _text_line(text, exc.position)
        begins = text.rfind("\n", 0, exc.position) + 1
        column = exc.position - begins + (0 if begins == 0 and text.startswith("\ufeff") else 1)  # a BOM is no column
        return f"{file}:{line}: invalid YAML at column {column}: character {exc.character:#06x} is not allowed in YAML"
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return f"{file}: invalid YAML: {' '.join(str(exc).split())}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    said = f" ({context}{f' that starts on line {start.line + 1}' if start is not None else ''})" if context else ""
    return f"{file}:{mark.line + 1}: invalid YAML at column {mark.column + 1}: {problem}{said}"


#: Values a config may hold once its YAML aliases are expanded (each alias counts again).
MAX_CONFIG_VALUES = 200_000


def _check_size(file: Path, root: yaml.Node) -> None:
    """Refuse a config whose aliases repeat it past :data:`MAX_CONFIG_VALUES` values, or into itself.

    YAML shares an aliased value, but every walk of the loaded config (variables,
    lines, validation) visits it once per alias: nine nested aliases of nine make
    a billion values from a few hundred bytes, and loading hung.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise ConfigError(f"{file}:{node.start_mark.line + 1}: a YAML alias refers to a value that holds it")
        open_nodes.add(key)
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1
        open_nodes.discard(key)
        if total > MAX_CONFIG_VALUES:
            raise ConfigError(
                f"{file}:{node.start_mark.line + 1}: its YAML aliases expand to more than "
                f"{MAX_CONFIG_VALUES:,} values; write the repeated parts out or use fewer aliases"
            )
        sizes[key] = total
        return total

    size(root)


def _duplicate_keys(node: yaml.Node, loc: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], int, int]]:
    """Keys given twice in one mapping (YAML loaders keep the last one in silence)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if key.value in seen:
                yield (*loc, key.value), line, seen[key.value]
            seen.setdefault(key.value, line)
            yield from _duplicate_keys(value, (*loc, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for index, value in enumerate(node.value):
            yield from _duplicate_keys(value, (*loc, index))


def _node_lines(node: yaml.Node, loc: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], int]]:
    yield loc, node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield (*loc, key.value), key.start_mark.line + 1
            for sub in _node_lines(value, (*loc, key.value)):
                if sub[0] != (*loc, key.value):
                    yield sub
    elif isinstance(node, yaml.SequenceNode):
        for index, value in enumerate(node.value):
            yield from _node_lines(value, (*loc, index))
