"""Reading one Harbor / Terminal-Bench 2 task directory (finding them under a folder: discovery.py).

A task directory holds ``instruction.md``, ``task.toml``, ``environment/``
(a Dockerfile and what it copies), ``tests/test.sh`` and optionally
``solution/solve.sh``. Only ``task.toml`` and ``instruction.md`` are read at
load time: nothing is built or hashed until an attempt needs it.

A task whose files are broken still loads, as a :class:`HarborTask` with
``error`` set: it is reported as a ``task_error`` with that message (naming
the file and line) while the other tasks run.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["ArtifactSpec", "HarborTask", "VerifierEnvironment", "expand_env", "parse_memory_mb", "read_task"]

TASK_FILE = "task.toml"
INSTRUCTION_FILE = "instruction.md"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")

_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MEMORY_FACTOR_MB = {"": 1 / 1024 / 1024, "k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}


#: Seconds for the agent, the verifier and the image build when ``task.toml`` names none
#: (a bound is better than a hang; Harbor's own defaults are of this order).
DEFAULT_TIMEOUT_SEC = 600.0


#: The largest value each numeric key may take: beyond it the number is a typo, and the engine would
#: refuse it with a traceback (Docker's int64 bytes overflow) taken for a transient failure. Generous:
#: a week for a timeout, 4096 CPUs, 16 TiB of memory or disk, 64 GPUs.
LIMITS: dict[str, float] = {
    "timeout_sec": 7 * 24 * 3600.0,
    "build_timeout_sec": 7 * 24 * 3600.0,
    "cpus": 4096.0,
    "memory_mb": 16 * 1024 * 1024.0,
    "storage_mb": 16 * 1024 * 1024.0,
    "gpus": 64.0,
}


class TaskFileError(ValueError):
    """A value of ``task.toml`` that cannot be used; the message names file, line and key."""


@dataclass(frozen=True)
class ArtifactSpec:
    """One entry of ``artifacts = [...]``: a path of the agent's environment handed to a separate
    verifier (a file, or a folder without the ``exclude`` patterns)."""

    source: str
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifierEnvironment:
    """``[verifier.environment]``: the separate verifier's own sandbox (unset values: none)."""

    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    allow_internet: bool | None = None
    build_timeout: float | None = None
    workdir: str | None = None


@dataclass(frozen=True)
class HarborTask:
    """What a task directory says, in the units the runtime uses (seconds, MB, flags)."""

    name: str
    path: Path
    instruction: str = ""
    agent_timeout: float | None = None
    verifier_timeout: float | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)
    build_timeout: float | None = None
    docker_image: str | None = None
    #: ``[environment] workdir``: where the agent, solution and verifier run (default: the image's WORKDIR).
    workdir: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int = 0
    allow_internet: bool = True
    #: ``[verifier] environment_mode`` (``shared`` or ``separate``; a ``[verifier.environment]``
    #: table alone means ``separate``); ``None``: not said, the request decides (shared by default).
    verifier_mode: str | None = None
    #: ``[verifier.environment]``, when the task has one.
    verifier_environment: VerifierEnvironment | None = None
    #: ``artifacts = [...]``: what a separate verifier gets of the agent's environment.
    artifacts: tuple[ArtifactSpec, ...] = ()
    category: str | None = None
    tags: tuple[str, ...] = ()
    #: Everything else ``task.toml`` holds (``[metadata]``, unknown tables), kept as written.
    config: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def compose_file(self) -> Path | None:
        return next((self.environment_dir / n for n in COMPOSE_FILES if (self.environment_dir / n).is_file()), None)


def expand_env(env: Mapping[str, str], table: str, task: HarborTask) -> dict[str, str]:
    """``env`` with Harbor's ``${NAME}`` / ``${NAME:-default}`` filled from this process's
    environment (how published tasks hand a judge its API key). Expanded values are secrets:
    they are masked in everything the run writes.

    :raises TaskFileError: naming the task file, the table and the variable that is not set.
    """
    from ...config import expand_variables
    from ...vocabulary.redact import add_runtime_secret

    expanded: dict[str, str] = {}
    for key, value in env.items():
        expanded[key], read, missing = expand_variables(value, os.environ)
        if missing:
            raise TaskFileError(
                f"{task.path / TASK_FILE}: [{table}.env] {key} needs the environment variable {missing[0]}, "
                "which is not set"
            )
        for secret in read:
            add_runtime_secret(secret)
    return expanded


def read_task(path: Path) -> HarborTask:
    """Parse ``path``; a broken task comes back with ``error`` set, never an exception."""
    toml_path = path / TASK_FILE
    link = _escaping_link(path, toml_path)
    if link:
        return HarborTask(name=path.name, path=path, error=link)
    try:
        text = toml_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return HarborTask(name=path.name, path=path, error=f"{toml_path}: cannot read: {exc}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        line = f":{found.group(1)}" if found else ""
        reason = _TOML_LINE.sub("", str(exc)).strip()
        return HarborTask(name=path.name, path=path, error=f"{toml_path}{line}: invalid TOML: {reason}")
    where = _Where(toml_path, text)
    try:
        task = _from_config(path, data, where)
    except TaskFileError as exc:
        return HarborTask(name=path.name, path=path, config=data, error=str(exc))
    instruction = path / INSTRUCTION_FILE
    link = _escaping_link(path, instruction)  # read before it goes to the model: never a host file
    if link:
        return HarborTask(name=path.name, path=path, config=data, error=link)
    try:
        task = replace(task, instruction=instruction.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return HarborTask(name=path.name, path=path, config=data, error=f"{instruction}: cannot read: {exc}")
    problem = _files_problem(task) or _unset_variable(task, where)
    return replace(task, error=problem) if problem else task


def _unset_variable(task: HarborTask, where: _Where) -> str | None:
    """The first ``[verifier.env]`` value naming a variable that is not set (nor defaulted).

    Checked when the task loads: found by the verifier, it cost the agent's
    whole run first. ``[solution.env]`` is left to the oracle that reads it.
    """
    from ...config import expand_variables

    for key, value in task.verifier_env.items():
        missing = expand_variables(value, os.environ)[2]
        if missing:
            at = where("verifier.env", key)
            if at == str(where.path):  # written inline: env = { KEY = "..." } under [verifier]
                at = where("verifier", "env")
            return f"{at}: [verifier.env] {key} needs the environment variable {missing[0]}, which is not set"
    return None


def _files_problem(task: HarborTask) -> str | None:
    """What makes the task's folders unusable: an empty Dockerfile, no verifier script."""
    for dockerfile in (task.environment_dir / "Dockerfile", task.path / "tests" / "Dockerfile"):
        if dockerfile.is_file() and not _instructions(dockerfile):
            return f"{dockerfile} is empty: it has no instruction to build an image from"
    tests = task.path / "tests"
    for link in sorted(p for p in tests.rglob("*") if p.is_symlink()) if tests.is_dir() else ():
        # Staged as a link: one that leaves tests/ (or leads nowhere) is broken in the container.
        target = os.readlink(link)
        inside = not os.path.isabs(target) and tests.resolve() in link.resolve().parents
        if not inside or not link.exists():
            why = "does not exist" if not link.exists() else "is outside tests/, which is all the verifier gets"
            return f"{link} is a symbolic link to {target}, which {why}"
    solution = task.path / "solution"
    for file in [solution, *sorted(_walk(solution))]:
        broken = _escaping_link(task.path, file)
        if broken:
            return broken
    own_image = task.verifier_environment is not None and task.verifier_environment.docker_image
    baked = task.verifier_mode == "separate" and ((tests / "Dockerfile").is_file() or bool(own_image))
    if not baked and not (tests / "test.sh").is_file():  # a separate verifier's image may bring its own
        return f"{tests / 'test.sh'} does not exist: the task has no verifier"
    return None


def _escaping_link(task: Path, file: Path) -> str | None:
    """Why ``file`` (or a link among its folders below ``task``) is unusable: a symbolic link that
    leaves the task folder or leads nowhere. Found without reading what it points to (a link to
    ``/proc/self/environ`` or a host secret is never opened); ``None`` when it is fine or absent."""
    rel = file.relative_to(task)
    for depth in range(1, len(rel.parts) + 1):
        part = task.joinpath(*rel.parts[:depth])
        if not part.is_symlink():
            continue
        target = os.readlink(part)
        try:
            resolved = part.resolve()  # follows every link, reads no file
        except (OSError, RuntimeError):  # a loop of links
            return f"{part} is a symbolic link to {target}, which leads back to itself"
        home = task.resolve()
        if resolved != home and home not in resolved.parents:
            return f"{part} is a symbolic link to {target}, which is outside the task folder {task}"
        if not resolved.exists():
            return f"{part} is a symbolic link to {target}, which does not exist"
    return None


def _walk(folder: Path) -> list[Path]:
    """Every path below ``folder``, links not followed (``folder`` itself a link: nothing)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    found = []
    for root, dirs, files in os.walk(folder):
        found += [Path(root, name) for name in (*dirs, *files)]
    return found


def _instructions(dockerfile: Path) -> bool:
    try:
        text = dockerfile.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # unreadable: the build says why
    return any(line.strip() and not line.strip().startswith("#") for line in text.splitlines())


class _Where:
    """Turns a key into ``file:line`` for messages (tomllib keeps no positions)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def __call__(self, table: str, key: str) -> str:
        section = f"[{table}]"
        inside = not table
        for number, line in enumerate(self.lines, 1):
            stripped = line.strip()
            if stripped.startswith("["):
                inside = stripped.split("#")[0].strip() == section
            elif inside and re.match(rf"{re.escape(key)}\s*=", stripped):
                return f"{self.path}:{number}"
        return str(self.path)


def _table(data: Mapping[str, Any], name: str, where: _Where) -> Mapping[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, Mapping):
        raise TaskFileError(f"{where('', name)}: {name} must be a table, not {type(value).__name__}")
    return value


def _number(table: Mapping[str, Any], name: str, key: str, where: _Where, *, integer: bool = False) -> Any:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TaskFileError(f"{where(name, key)}: [{name}] {key} must be a non-negative number, not {value!r}")
    _check_limit(value, name, key, where(name, key))
    return int(value) if integer else float(value)


def _check_limit(value: float, table: str, key: str, at: str, shown: str | None = None) -> None:
    """:raises TaskFileError: when ``value`` of ``key`` is beyond :data:`LIMITS` (``shown``: the key as written)."""
    limit = LIMITS.get(key)
    if limit is not None and value > limit:
        unit = " (in MB)" if shown else ""
        raise TaskFileError(
            f"{at}: [{table}] {shown or key} is {_cut_number(value)}{unit}, more than {int(limit)}, the most it may be"
        )


def _cut_number(value: float) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def _env(table: Mapping[str, Any], name: str, where: _Where) -> dict[str, str]:
    value = table.get("env") or {}
    if not isinstance(value, Mapping):
        raise TaskFileError(f"{where(name, 'env')}: [{name}] env must be a table of strings")
    return {str(k): str(v) for k, v in value.items()}


def _size_mb(environment: Mapping[str, Any], name: str, where: _Where, table: str = "environment") -> int | None:
    """``[<table>] <name>_mb``, else the deprecated ``<name> = "4G"`` form, in megabytes."""
    value = _number(environment, table, f"{name}_mb", where, integer=True)
    if value is None and environment.get(name) is not None:
        value = parse_memory_mb(environment[name])
        if value is None:
            raise TaskFileError(
                f'{where(table, name)}: [{table}] {name} must be a size like "4G", not {environment[name]!r}'
            )
        _check_limit(value, table, f"{name}_mb", where(table, name), shown=name)
    return value  # type: ignore[no-any-return]


def parse_memory_mb(value: Any) -> int | None:
    """``"4G"``, ``"512M"``, ``"2048Mi"`` -> megabytes; ``None`` if it is not a size."""
    found = _MEMORY.match(str(value))
    if not found:
        return None
    return max(1, round(float(found.group(1)) * _MEMORY_FACTOR_MB[found.group(2).lower()]))


def _from_config(path: Path, data: Mapping[str, Any], where: _Where) -> HarborTask:
    metadata = _table(data, "metadata", where)
    agent = _table(data, "agent", where)
    verifier = _table(data, "verifier", where)
    solution = _table(data, "solution", where)
    environment = _table(data, "environment", where)
    task_table = _table(data, "task", where)  # schema 1.1: name, description, keywords

    memory_mb = _size_mb(environment, "memory", where)
    allow_internet = environment.get("allow_internet")
    if allow_internet is None and "network_mode" in environment:  # older tasks
        allow_internet = environment["network_mode"] != "none"
    if allow_internet is not None and not isinstance(allow_internet, bool):
        raise TaskFileError(
            f"{where('environment', 'allow_internet')}: [environment] allow_internet must be true or false"
        )
    image = environment.get("docker_image")
    if image is not None and not isinstance(image, str):
        raise TaskFileError(f"{where('environment', 'docker_image')}: [environment] docker_image must be a string")
    workdir = environment.get("workdir")
    if workdir is not None and not (isinstance(workdir, str) and workdir.startswith("/")):
        raise TaskFileError(f"{where('environment', 'workdir')}: [environment] workdir must be an absolute path")
    category = metadata.get("category")
    tags = [*_strings(metadata.get("tags")), *_strings(task_table.get("keywords"))]
    verifier_environment = _verifier_environment(verifier, where)
    mode = verifier.get("environment_mode")
    if mode is not None and mode not in ("shared", "separate"):
        raise TaskFileError(
            f"{where('verifier', 'environment_mode')}: [verifier] environment_mode must be "
            f'"shared" or "separate", not {mode!r}'
        )
    if mode == "shared" and verifier_environment is not None:
        raise TaskFileError(
            f'{where("verifier", "environment_mode")}: [verifier] environment_mode is "shared" but the task '
            "has a [verifier.environment] table, which only a separate verifier uses"
        )
    if mode is None and verifier_environment is not None:
        mode = "separate"  # as Harbor reads it
    return HarborTask(
        name=path.name,
        path=path,
        agent_timeout=_number(agent, "agent", "timeout_sec", where) or DEFAULT_TIMEOUT_SEC,
        verifier_timeout=_number(verifier, "verifier", "timeout_sec", where) or DEFAULT_TIMEOUT_SEC,
        verifier_env=_env(verifier, "verifier", where),
        solution_env=_env(solution, "solution", where),
        build_timeout=_number(environment, "environment", "build_timeout_sec", where) or DEFAULT_TIMEOUT_SEC,
        docker_image=image or None,
        workdir=workdir,
        cpus=_number(environment, "environment", "cpus", where),
        memory_mb=memory_mb,
        storage_mb=_size_mb(environment, "storage", where),
        gpus=_number(environment, "environment", "gpus", where, integer=True) or 0,
        allow_internet=True if allow_internet is None else allow_internet,
        verifier_mode=mode,
        verifier_environment=verifier_environment,
        artifacts=_artifacts(data.get("artifacts"), where),
        category=str(category) if category else None,
        tags=tuple(dict.fromkeys(tags)),
        config=data,
    )


def _verifier_environment(verifier: Mapping[str, Any], where: _Where) -> VerifierEnvironment | None:
    table = verifier.get("environment")
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise TaskFileError(f"{where('verifier', 'environment')}: [verifier] environment must be a table")
    name = "verifier.environment"
    image = table.get("docker_image")
    if image is not None and not isinstance(image, str):
        raise TaskFileError(f"{where(name, 'docker_image')}: [{name}] docker_image must be a string")
    allow = table.get("allow_internet")
    if allow is None and "network_mode" in table:
        allow = table["network_mode"] not in ("none", "no-network")
    if allow is not None and not isinstance(allow, bool):
        raise TaskFileError(f"{where(name, 'allow_internet')}: [{name}] allow_internet must be true or false")
    workdir = table.get("workdir")
    if workdir is not None and not (isinstance(workdir, str) and workdir.startswith("/")):
        raise TaskFileError(f"{where(name, 'workdir')}: [{name}] workdir must be an absolute path")
    return VerifierEnvironment(
        docker_image=image or None,
        cpus=_number(table, name, "cpus", where),
        memory_mb=_size_mb(table, "memory", where, name),
        storage_mb=_size_mb(table, "storage", where, name),
        allow_internet=allow,
        build_timeout=_number(table, name, "build_timeout_sec", where),
        workdir=workdir,
    )


def _artifacts(value: Any, where: _Where) -> tuple[ArtifactSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TaskFileError(f"{where('', 'artifacts')}: artifacts must be a list of paths")
    found = []
    for entry in value:
        source: Any = entry if isinstance(entry, str) else None
        exclude: Any = []
        if isinstance(entry, Mapping):
            source, exclude = entry.get("source"), entry.get("exclude") or []
        if not (isinstance(source, str) and source.startswith("/")) or not isinstance(exclude, list):
            raise TaskFileError(
                f"{where('', 'artifacts')}: each artifact is an absolute path or "
                f'{{ source = "/abs/path", exclude = [...] }}, not {entry!r}'
            )
        found.append(ArtifactSpec(source, tuple(str(x) for x in exclude)))
    return tuple(found)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [str(v) for v in value if isinstance(v, str | int | float) and str(v)]
    return []
