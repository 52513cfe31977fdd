"""What a separate verifier gets of the agent's environment: ``/logs/artifacts`` and the task's
``artifacts = [...]`` paths, nothing else.

They are copied out of the agent's (frozen) container into the try's
artifacts (``transfer/<path>``, capped like every copy) by
``collect_artifacts``, and written back at their original absolute paths
in the verifier's container by ``evaluate``, through the engine's archive
API. A path the verifier relies on that arrives this way (a ``pytest.py``
in its working directory, a ``.pth`` file) is flagged like a changed file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from ...environments.base import EnvironmentSession
from ...environments.transfer import trusted
from .integrity import RULES, classify, finding, path_dirs_of, path_findings, python_path_of
from .session_io import copy_folder
from .taskdir import ArtifactSpec
from .verifier import shadowing_modules

__all__ = ["restore_artifacts", "take_artifacts"]

#: Go's FileMode bits in the engine's stat: a folder, a symbolic link.
_DIR, _LINK = 1 << 31, 1 << 27


async def take_artifacts(
    env: EnvironmentSession, specs: Sequence[ArtifactSpec], limit: int, time_limit: float | None
) -> dict[str, Any]:
    """Copy each declared artifact out of ``env``; returns what was copied, per artifact."""
    access = trusted(env)
    entries: list[dict[str, Any]] = []
    budget = limit
    for spec in specs:
        info = await access.stat(spec.source) if access is not None else None
        if info is None:
            entries.append({"source": spec.source, "kind": "missing"})
            continue
        mode = int(info.get("mode") or 0)
        if mode & _LINK:
            entries.append({"source": spec.source, "kind": "link", "note": "a symbolic link: not followed"})
            continue
        kind = "folder" if mode & _DIR else "file"
        base = spec.source if kind == "folder" else str(PurePosixPath(spec.source).parent)
        copied = await copy_folder(env, spec.source, "transfer" + base.rstrip("/"), budget, time_limit, spec.exclude)
        budget = max(0, budget - int(copied.get("bytes", 0)))
        entries.append({"source": spec.source, "kind": kind, "copied": copied})
    return {"artifacts": entries}


async def restore_artifacts(
    env: EnvironmentSession, metadata: Mapping[str, Any], run_dir: Path | None, workdir: str
) -> list[dict[str, Any]]:
    """Write ``/logs/artifacts`` and the declared artifacts back into the verifier's ``env``.

    ``metadata`` is the result's (its ``copied`` and ``transfer``). Returns
    findings for files that land where the verifier would run them.
    """
    if run_dir is None:
        return []
    access = trusted(env)
    path_dirs = path_dirs_of(await access.environ()) if access is not None else []
    targets: list[tuple[Path, str]] = []
    logs = (metadata.get("copied") or {}).get("/logs/artifacts") or {}
    targets += _files(logs, run_dir, "/logs/artifacts", folder_kind=True)
    for entry in (metadata.get("transfer") or {}).get("artifacts") or []:
        copied = entry.get("copied") or {}
        targets += _files(copied, run_dir, str(entry["source"]), folder_kind=entry.get("kind") == "folder")
    found: list[dict[str, Any]] = []
    restored: list[tuple[str, str]] = []
    for local, target in targets:
        with contextlib.suppress(FileNotFoundError):  # a copy the store could not keep: nothing to restore
            await env.write_bytes(target, local.read_bytes())
            restored.append(("added", target))
            check = classify("added", target, workdir, path_dirs)
            if check is not None and check not in ("planted-tests", "planted-verifier-logs"):
                message = f"{target} came with the agent's artifacts: {RULES[check].why}"
                found.append(finding(check, target, message))
    if access is not None:  # a Python file of the working directory that shadows a module the verifier imports
        modules = path_findings(restored, workdir, path_dirs).workdir_modules
        found += await shadowing_modules(access, modules, python_path_of(await access.environ()))
    return found


def _files(copied: Mapping[str, Any], run_dir: Path, source: str, *, folder_kind: bool) -> list[tuple[Path, str]]:
    folder = copied.get("folder")
    if not folder:
        return []
    renamed = copied.get("renamed") or {}
    pairs = []
    for safe in copied.get("stored") or []:
        original = renamed.get(safe, safe)
        target = f"{source.rstrip('/')}/{original}" if folder_kind else source
        pairs.append((run_dir / folder / safe, target))
    return pairs
