"""``python -m pytest_agentcompass agents fetch [AGENT[@VERSION] ...]``: fill the agent package cache ahead.

A CI job (or a machine with a registry, whose cache folder is then copied
to one without) runs it before the tests, so the runs themselves find every
agent's packages cached and never wait for a registry. Agents are fetched at
once; each line says what is cached where, or why it could not be fetched.

Exit codes: 0 all cached, 1 a fetch failed, 2 an unknown agent.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from ...vocabulary.errors import AgentCompassError
from . import AGENTS
from .cache import PackageCache, default_cache_dir, ensure_packages

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pytest_agentcompass agents", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="fetch agents' packages into the cache (default: every built-in agent)")
    fetch.add_argument("agents", nargs="*", metavar="AGENT[@VERSION]", help=f"one of {', '.join(AGENTS)}")
    fetch.add_argument("--cache-dir", type=Path, help=f"the cache folder (default: {default_cache_dir()})")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    try:
        harnesses = [_harness(spec, args.cache_dir) for spec in args.agents or list(AGENTS)]
    except AgentCompassError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = args.cache_dir or default_cache_dir()
    results = asyncio.run(_fetch_all(harnesses, PackageCache(root)))
    failed = 0
    for harness, result in zip(harnesses, results, strict=True):
        name = f"{harness.id} {harness.agent_version}"
        if isinstance(result, BaseException):
            failed += 1
            print(f"{name}: not fetched: {result}", file=out)
        else:
            size = sum(f.size for f in result.files)
            print(f"{name}: cached in {result.path} ({len(result.files)} file(s), {size / 1e6:.0f} MB)", file=out)
    return 1 if failed else 0


def _harness(spec: str, cache_dir: Path | None) -> Any:
    import importlib

    agent, _, version = spec.partition("@")
    if agent not in AGENTS:
        raise AgentCompassError(f"unknown agent {agent!r}: the built-in agents are {', '.join(AGENTS)}")
    module, name = AGENTS[agent]
    cls = getattr(importlib.import_module(f".{module}", __package__), name)
    params: dict[str, Any] = {"version": version} if version else {}
    if cache_dir is not None:
        params["cache_dir"] = str(cache_dir)
    return cls(**params)


async def _fetch_all(harnesses: list[Any], cache: PackageCache) -> list[Any]:
    async def one(harness: Any) -> Any:
        version = harness.agent_version
        return await ensure_packages(cache, harness.id, version, harness.packages(version))

    # Every agent at once; one that fails does not stop the others (each line says how it went).
    return await asyncio.gather(*(one(h) for h in harnesses), return_exceptions=True)
