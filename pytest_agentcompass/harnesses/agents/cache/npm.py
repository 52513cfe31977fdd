"""npm packages: ``npm view`` for the published integrity, ``npm pack`` for the tarball.

Both go through the ``npm`` on this machine, so its registry, scopes, proxy
and credentials (``.npmrc``, ``npm_config_*``) apply. The tarball is checked
against the registry's ``dist.integrity`` (SHA-512) before it enters the cache.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fetch import Fetched, FetchError, run_tool

__all__ = ["NpmPackage", "tarball_name"]

#: Quiet, and nothing but the two commands (no update check, funding or audit requests).
_NPM_ENV = {
    "npm_config_update_notifier": "false",
    "npm_config_fund": "false",
    "npm_config_audit": "false",
    "npm_config_loglevel": "error",
}
#: Fail fast when the registry does not answer (npm's own defaults: 3 tries, 5 minutes each);
#: the user's ``npm_config_*`` variables win. A tarball download keeps npm's long timeout.
_NPM_DEFAULTS = {
    "npm_config_fetch_retries": "1",
    "npm_config_fetch_retry_mintimeout": "1000",
    "npm_config_fetch_retry_maxtimeout": "5000",
}
_LOOKUP_DEFAULTS = {**_NPM_DEFAULTS, "npm_config_fetch_timeout": "15000"}
_SRI_ALGORITHMS = {"sha512": "sha512", "sha384": "sha384", "sha256": "sha256", "sha1": "sha1"}


def tarball_name(name: str, version: str) -> str:
    """The file name a package's tarball has in the cache: ``npm pack``'s own (``@a/b`` -> ``a-b-1.0.tgz``)."""
    return f"{name.removeprefix('@').replace('/', '-')}-{version}.tgz"


def _strongest(integrity: str) -> tuple[str, str]:
    """The strongest hash of an SRI string (``sha512-<base64> sha1-...``) as (algorithm, hex)."""
    found: dict[str, str] = {}
    for token in integrity.split():
        algorithm, _, value = token.partition("-")
        if algorithm in _SRI_ALGORITHMS and value:
            found[algorithm] = base64.b64decode(value.split("?")[0]).hex()
    for algorithm in _SRI_ALGORITHMS:  # strongest first
        if algorithm in found:
            return algorithm, found[algorithm]
    raise ValueError(f"no usable hash in {integrity!r}")


@dataclass(frozen=True)
class NpmPackage:
    """``name@version`` from the npm registry (an exact version: pins are what make a run repeatable)."""

    name: str
    version: str

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def file_name(self) -> str:
        return tarball_name(self.name, self.version)

    def describe(self) -> dict[str, Any]:
        return {"npm": self.spec}

    async def fetch(self, into: Path) -> list[Fetched]:
        try:
            return await self._fetch(into)
        except FetchError as exc:
            raise FetchError(f"npm package {self.spec} from the registry {await npm_registry()}: {exc}") from None

    async def _fetch(self, into: Path) -> list[Fetched]:
        look_up = ["npm", "view", self.spec, "dist", "--json"]
        shown = await run_tool(look_up, f"look up {self.spec}", _NPM_ENV, _LOOKUP_DEFAULTS)
        try:
            dist = json.loads(shown) if shown.strip() else None
        except ValueError:
            raise FetchError(f"`npm view {self.spec} dist --json` printed no JSON: {shown[:300]!r}") from None
        if isinstance(dist, list):  # a range that matched several versions
            raise FetchError(f"{self.spec} names {len(dist)} versions; give one exact version")
        if not isinstance(dist, dict):
            raise FetchError(f"the npm registry has no version {self.version!r} of {self.name!r}")
        integrity = str(dist.get("integrity") or "")
        try:
            algorithm, digest = _strongest(integrity)
        except ValueError:
            raise FetchError(f"the npm registry published no integrity hash for {self.spec}") from None
        folder = into / f"npm-{os.urandom(4).hex()}"
        folder.mkdir()
        packed = await run_tool(
            ["npm", "pack", self.spec, "--json", "--pack-destination", str(folder)],
            f"download {self.spec}",
            _NPM_ENV,
            _NPM_DEFAULTS,
        )
        try:
            filename = str(json.loads(packed)[0]["filename"])
        except (ValueError, LookupError, TypeError):
            raise FetchError(f"`npm pack {self.spec}` did not say which file it wrote: {packed[:300]!r}") from None
        path = folder / self.file_name
        os.replace(folder / filename, path)
        return [Fetched(path, {algorithm: digest}, str(dist.get("tarball") or self.spec))]


async def npm_registry() -> str:
    """The registry ``npm`` uses here (its config: ``.npmrc``, ``npm_config_registry``), for messages."""
    try:
        return (await run_tool(["npm", "config", "get", "registry"], "read its registry", _NPM_ENV)).strip() or "?"
    except FetchError:
        return "(npm did not say)"
