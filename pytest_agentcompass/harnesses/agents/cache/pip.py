"""Python wheels: resolved by ``pip install --dry-run --report``, downloaded by ``pip download``.

pip runs as ``python -m pip`` of this interpreter, so the user's pip
configuration (``pip.conf``, ``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, a
proxy, credentials) applies. The dependency tree is resolved once per target
Python version for Linux x86-64 (manylinux wheels only: nothing is built on
the host for another interpreter); the report names every file and the hash
its index published, and each downloaded wheel is checked against it. Pure
Python wheels are the same file for every version, so the cache keeps them once.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .fetch import Fetched, FetchError, run_tool

__all__ = ["LINUX_X86_64", "PipWheels"]

#: Wheel platforms a glibc x86-64 container runs (glibc >= 2.17; newer wheels need >= 2.28).
LINUX_X86_64 = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
_QUIET = ["--quiet", "--no-input", "--disable-pip-version-check"]
#: Fail fast when the index does not answer (pip's own defaults: 6 tries, 15 s each, per request);
#: the user's ``PIP_*`` variables win.
_PIP_DEFAULTS = {"PIP_RETRIES": "1", "PIP_TIMEOUT": "15"}


@dataclass(frozen=True)
class PipWheels:
    """``requirements`` and their dependencies, as wheels, for each of ``python_versions``."""

    requirements: tuple[str, ...]
    python_versions: tuple[str, ...]
    platforms: tuple[str, ...] = LINUX_X86_64
    #: The interpreter whose pip fetches (this one by default).
    python: str = field(default=sys.executable, compare=False)

    def describe(self) -> dict[str, Any]:
        return {
            "pip": list(self.requirements),
            "python_versions": list(self.python_versions),
            "platforms": list(self.platforms),
        }

    def _target(self, version: str) -> list[str]:
        flags = ["--only-binary=:all:", "--implementation", "cp", "--python-version", version]
        for platform in self.platforms:
            flags += ["--platform", platform]
        return flags

    async def fetch(self, into: Path) -> list[Fetched]:
        try:
            return await self._fetch(into)
        except FetchError as exc:
            raise FetchError(f"{', '.join(self.requirements)} from the index {await self.index()}: {exc}") from None

    async def index(self) -> str:
        """The index pip uses here (``PIP_INDEX_URL``, its config files, else PyPI), for messages."""
        if os.environ.get("PIP_INDEX_URL"):
            return os.environ["PIP_INDEX_URL"]
        try:
            listed = await run_tool([self.python, "-m", "pip", "config", "list"], "read its config")
        except FetchError:
            listed = ""
        for line in listed.splitlines():
            name, _, value = line.partition("=")
            if name.endswith(".index-url"):
                return value.strip().strip("'\"")
        return "https://pypi.org/simple"

    async def _fetch(self, into: Path) -> list[Fetched]:
        wheels = into / "wheels"
        wheels.mkdir(exist_ok=True)
        expected: dict[str, tuple[dict[str, str], str]] = {}  # file name -> (hashes, url)
        for version in self.python_versions:
            resolved = await self._resolve(into, version)
            expected.update(resolved)
            pins = sorted({_pin(name) for name in resolved})
            await run_tool(
                [
                    self.python, "-m", "pip", "download", *_QUIET, "--no-deps", *self._target(version),
                    "--dest", str(wheels), *pins,
                ],
                f"download the wheels of {', '.join(self.requirements)} for Python {version}",
                defaults=_PIP_DEFAULTS,
            )  # fmt: skip
        fetched = []
        for path in sorted(wheels.iterdir()):
            if path.name not in expected:
                raise FetchError(f"pip downloaded {path.name}, which its resolution did not name")
            hashes, url = expected[path.name]
            fetched.append(Fetched(path, hashes, url))
        missing = sorted(set(expected) - {f.path.name for f in fetched})
        if missing:
            raise FetchError(f"pip resolved but did not download {', '.join(missing)}")
        return fetched

    async def _resolve(self, into: Path, version: str) -> dict[str, tuple[dict[str, str], str]]:
        """File name -> (published hashes, URL) of every wheel the requirements need on ``version``."""
        report = into / f"report-{version}.json"
        await run_tool(
            [
                self.python, "-m", "pip", "install", *_QUIET, "--dry-run", "--ignore-installed",
                "--report", str(report), "--target", str(into / f"target-{version}"), *self._target(version),
                *self.requirements,
            ],
            f"resolve {', '.join(self.requirements)} for Python {version} (Linux x86-64 wheels)",
            defaults=_PIP_DEFAULTS,
        )  # fmt: skip
        try:
            items = json.loads(report.read_text())["install"]
            files = {}
            for item in items:
                info = item["download_info"]
                url = str(info["url"])
                hashes = dict((info.get("archive_info") or {}).get("hashes") or {})
                name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
                files[name] = ({k: str(v) for k, v in hashes.items() if k == "sha256"}, url)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FetchError(f"pip's resolution report {report} is unreadable: {exc}") from None
        return files


def _pin(file_name: str) -> str:
    """``name==version`` of a wheel file (``mini_swe_agent-2.4.6-py3-none-any.whl``)."""
    name, version = file_name.split("-")[:2]
    return f"{name}=={version}"
