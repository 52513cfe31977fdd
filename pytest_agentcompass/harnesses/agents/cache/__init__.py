"""The host-side cache of the packages agent CLIs are installed from.

:mod:`.store` is the content-addressed folder, :mod:`.fetch` fills it once
per key (locked across processes), :mod:`.npm` and :mod:`.pip` are the two
kinds of source. Nothing here runs a container.
"""

from __future__ import annotations

from .fetch import Fetched, FetchError, PackageSource, cache_key, ensure_packages
from .npm import NpmPackage, tarball_name
from .pip import PipWheels
from .store import CacheCorrupt, CachedFile, CachedSet, PackageCache, default_cache_dir

__all__ = [
    "CacheCorrupt",
    "CachedFile",
    "CachedSet",
    "FetchError",
    "Fetched",
    "NpmPackage",
    "PackageCache",
    "PackageSource",
    "PipWheels",
    "cache_key",
    "default_cache_dir",
    "ensure_packages",
    "tarball_name",
]
