"""The ``docker`` provider's params, and the limits a container is created with.

A benchmark's per-task params (``ExecutionPlan.environment``) fill what the
config did not set; an evaluation session also takes the plan's
``evaluation`` params over them (a verifier image of its own, a snapshot of
the task's container; see :func:`session_params`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from ..config import ParamsModel
from .docker_engine import EngineParams, check_engines, engine_urls_as_mappings
from .docker_network import FirewallMode
from .process import DEFAULT_OUTPUT_LIMIT

__all__ = ["DEFAULT_PIDS_LIMIT", "DockerParams", "limits", "session_params", "storage_refused"]

#: Processes one container may hold: a fork bomb stops there, far below a host's ``pid_max``
#: (32768 on many machines) even with several containers at once.
DEFAULT_PIDS_LIMIT = 1024


class DockerParams(ParamsModel):
    """``environment.params`` of the ``docker`` provider."""

    #: The image every session starts from.
    image: str | None = None
    #: The working directory inside the container (created by Docker); ``null``: the image's WORKDIR.
    workdir: str | None = "/work"
    #: Container memory limit (``"512m"`` or bytes).
    mem_limit: int | str | None = None
    #: CPU quota in billionths of a CPU.
    nano_cpus: int | None = Field(default=None, gt=0)
    #: Processes a container may hold (a fork bomb ends there); ``null`` or 0: no limit.
    pids_limit: int | None = Field(default=DEFAULT_PIDS_LIMIT, ge=0)
    #: A task's disk quota (``storage_mb``): ``auto`` applies it where the engine's storage driver
    #: can (overlay2 on xfs with project quotas, btrfs, zfs, devicemapper) and says once where it
    #: cannot; ``require`` makes such a task an environment error; ``off`` never applies it.
    storage_limits: Literal["auto", "require", "off"] = "auto"
    #: The most a snapshot (verifier mode ``snapshot``) may copy of a container's changes, in MB: a commit
    #: copies every changed file in full, sparse ones too, and a larger container is not verified.
    snapshot_limit_mb: int = Field(default=4096, gt=0)
    #: Record the host pids of a container's own processes (the engine's init and the runner's keepalive)
    #: as it starts, one engine request more: for a benchmark that tells the agent's processes from them
    #: (Harbor's verifier lists what the agent left running). Known by pid, never by command line.
    record_pids: bool = False
    #: Captured output kept per stream, in bytes.
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)
    #: Pull the image when the engine does not have it.
    pull: bool = False
    #: Task images (a benchmark's per-task build contexts) built at once, per process.
    max_parallel_builds: int = Field(default=2, ge=1)
    #: A pool of engines (URLs or ``{url, capacity, tls}``); ``null``: the environment's engine (``DOCKER_HOST``).
    engines: list[EngineParams] | None = None
    #: Seconds between probes of an engine that stopped answering.
    probe_interval: float = Field(default=5.0, gt=0)
    #: Close the host to the model gateway's network but for the gateway's port (iptables, as root):
    #: ``auto`` where possible (else a note), ``required`` (else the attempt fails), ``off``.
    gateway_firewall: FirewallMode = "auto"

    @field_validator("engines", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        return engine_urls_as_mappings(value)

    @field_validator("engines")
    @classmethod
    def _engines(cls, value: list[EngineParams] | None) -> list[EngineParams] | None:
        return check_engines(value)


def session_params(params: Mapping[str, Any], purpose: str) -> dict[str, Any]:
    """``params`` for a session of ``purpose``: an evaluation session takes ``params["evaluation"]`` over them."""
    merged = dict(params)
    override = merged.pop("evaluation", None)
    if purpose == "evaluation" and isinstance(override, Mapping):
        merged.update(override)
    return merged


def limits(params: Mapping[str, Any]) -> dict[str, Any]:
    """Host-config limits: memory, CPU, processes, and the disk quota (``storage_opt``) when asked for."""
    host: dict[str, Any] = {}
    for key in ("mem_limit", "nano_cpus"):
        if params.get(key) is not None:
            host[key] = params[key]
    if params.get("nano_cpus") is None and params.get("cpus"):
        host["nano_cpus"] = int(float(params["cpus"]) * 1e9)
    if params.get("mem_limit") is None and params.get("memory_mb"):
        host["mem_limit"] = f"{int(params['memory_mb'])}m"
    pids = params.get("pids_limit", DEFAULT_PIDS_LIMIT)
    if pids:
        host["pids_limit"] = int(pids)
    if params.get("storage_mb") and params.get("storage_limits", "auto") != "off":
        host["storage_opt"] = {"size": f"{int(params['storage_mb'])}M"}
    return host


def storage_refused(exc: BaseException) -> bool:
    """Whether the engine refused a container for its ``storage_opt`` (its storage driver cannot)."""
    text = str(exc).lower()
    return "storage-opt" in text or "storage opt" in text or "storageopt" in text
