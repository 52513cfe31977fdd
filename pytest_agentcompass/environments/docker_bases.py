"""The images a Dockerfile builds ``FROM``, and where to find them on an engine that has no registry.

Shared by the builder (``docker_images``) and the build job (``docker_build``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["base_images", "from_lines", "has_image", "local_base", "rewrite_bases"]

_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.MULTILINE)


def local_base(client: Any, ref: str) -> str | None:
    """The local image to build ``FROM ref`` on: ``ref`` itself when the engine has it, else the
    same image by its short name (``public.ecr.aws/docker/library/debian:bookworm-slim@sha256:...``
    -> ``debian:bookworm-slim``) when the engine has that: how published tasks build offline
    on locally made base images. ``None`` when neither is there."""
    if has_image(client, ref):
        return ref
    name = ref.split("@", 1)[0]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # a registry host
    while len(parts) > 1 and parts[0] in ("docker", "library"):
        parts = parts[1:]
    short = "/".join(parts)
    if ":" not in parts[-1]:
        short += ":latest"
    return short if short != ref and has_image(client, short) else None


def from_lines(dockerfile_text: str) -> list[tuple[int, int, str]]:
    """``(start, end, image)`` of every ``FROM`` image that is not a build stage, ``scratch`` or an ``ARG``."""
    stages: set[str] = set()
    found: list[tuple[int, int, str]] = []
    for match in _FROM.finditer(dockerfile_text):
        name, alias = match.group(1), match.group(2)
        if name.lower() != "scratch" and name not in stages and "$" not in name:
            found.append((match.start(1), match.end(1), name))
        if alias:
            stages.add(alias)
    return found


def base_images(client: Any, dockerfile: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """The images ``dockerfile`` builds ``FROM`` -> the ids of the local images used for them.

    ``known`` (name -> id) is consulted and filled: tasks of one run mostly share
    their ``FROM`` images, which are then looked up once, not twice per task.
    """
    found: dict[str, str] = {}
    for _, _, name in from_lines(dockerfile.read_text(encoding="utf-8", errors="replace")):
        if known is not None and name in known:
            found[name] = known[name]
            continue
        local = local_base(client, name)
        found[name] = str(client.images.get(local).id) if local else "absent"  # the build will say so
        if known is not None and local:
            known[name] = found[name]
    return found


def rewrite_bases(client: Any, dockerfile_text: str) -> tuple[str, list[str]]:
    """``dockerfile_text`` with every ``FROM`` image the engine lacks replaced by its local
    short-name twin (see :func:`local_base`), and a note per replacement."""
    notes: list[str] = []
    text = dockerfile_text
    for start, end, name in reversed(from_lines(dockerfile_text)):
        local = local_base(client, name)
        if local is not None and local != name:
            text = text[:start] + local + text[end:]
            notes.append(f"FROM {name}: not on the engine, using the local image {local}")
    return text, notes[::-1]


def has_image(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except Exception:
        return False
    return True
