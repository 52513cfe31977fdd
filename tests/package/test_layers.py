"""The package's folders are layers, and no module imports one of a higher layer.

Every import counts: at module level, under ``TYPE_CHECKING`` and inside
functions (a lazy import defers the cost, not the dependency).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest_agentcompass

PACKAGE = Path(pytest_agentcompass.__file__).parent
ROOT = PACKAGE.name

#: Each top-level folder's layer, lowest first (docs/how-it-works.md, "Layers", says why).
LAYERS = {
    # vocabulary: the spec's data types, errors, redaction, the config
    "vocabulary": 0,
    "config": 0,
    # process-wide concurrency primitives
    "concurrency": 1,
    # extension points, and the order among them
    "models": 2,
    "environments": 3,
    "gateway": 4,
    "benchmarks": 5,
    "harnesses": 5,
    "analyzers": 5,
    # the runtime, the reports it writes and reads back, the pytest face
    "runtime": 6,
    "reports": 7,
    "plugin": 8,
}
#: The package's own ``__init__`` (the public names, loaded lazily) and ``__main__`` sit on top.
TOP = max(LAYERS.values()) + 1


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    folder = module.split(".")[1] if "." in module else ""
    if folder in ("", "__main__"):
        return TOP
    assert folder in LAYERS, f"{module}: its folder {folder!r} has no layer in LAYERS"
    return LAYERS[folder]


def imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` of each import of a module of the package (the deepest that exists)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from .x import y``: y may be a module of x, or a name defined in it.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            if target == ROOT or target.startswith(ROOT + "."):
                yield node.lineno, target


def test_every_folder_has_a_layer() -> None:
    folders = {m.split(".")[1] for m in MODULES if m.count(".") >= 1} - {"__main__"}
    assert sorted(folders - set(LAYERS)) == []
    assert sorted(set(LAYERS) - folders) == [], "a layer names a folder that does not exist"


def test_no_module_imports_a_higher_layer_or_a_module_that_does_not_exist() -> None:
    problems = []
    for module, path in sorted(MODULES.items()):
        for line, target in imports(module, path):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if target not in MODULES:
                problems.append(f"{where}: {target} is no module of the package")
            elif target != ROOT and layer_of(target) > layer_of(module):
                # The package itself is always imported first: importing it loads nothing new.
                problems.append(
                    f"{where}: {module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
                )
    assert problems == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The walk finds lazy and ``TYPE_CHECKING`` imports, relative ones resolved from the module's package."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..runtime.request import RequestRuntime\n"
        "def later():\n    from ..plugin import keys\n"
    )
    found = list(imports(f"{ROOT}.environments.probe", source))
    assert found == [(3, f"{ROOT}.runtime.request"), (5, f"{ROOT}.plugin.keys")]
    assert [layer_of(t) > layer_of(f"{ROOT}.environments.local") for _, t in found] == [True, True]


#: Below the pytest face nothing imports pytest: the runtime runs under a plain ``asyncio.run`` and
#: the reports render a run directory on their own. The provider conformance kit is a test suite.
PYTEST_MODULES = ("pytest", "_pytest", "pluggy", "xdist")
MAY_IMPORT_PYTEST = {f"{ROOT}.environments.conformance"}


def test_nothing_below_the_pytest_face_imports_pytest() -> None:
    found = []
    for module, path in sorted(MODULES.items()):
        if layer_of(module) >= LAYERS["plugin"] or module in MAY_IMPORT_PYTEST:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            found += [f"{module}:{node.lineno}: {n}" for n in names if n.split(".")[0] in PYTEST_MODULES]
    assert found == []
