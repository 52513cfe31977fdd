"""Looking into containers from the outside (the ``docker`` CLI): what a run left in them."""

from __future__ import annotations

import io
import subprocess
import tarfile

__all__ = ["changed_files", "docker"]


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


def changed_files(container: str) -> dict[str, bytes]:
    """Every file the run added to or changed in ``container``, by path."""
    out: dict[str, bytes] = {}
    for line in docker("diff", container).splitlines():
        kind, path = line.split(" ", 1)
        if kind == "D":
            continue
        archive = subprocess.run(["docker", "cp", f"{container}:{path}", "-"], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as files:
            for member in files.getmembers():
                if member.isfile():
                    out[path] = files.extractfile(member).read()  # type: ignore[union-attr]
    return out
