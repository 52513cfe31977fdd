"""The engines of a Docker pool: their config (``params.engines``), clients and health probes.

An engine is a URL (``unix://``, ``tcp://`` with TLS files, ``ssh://`` through
the SDK's paramiko transport) or ``{url, capacity, tls}``; the params model
checks URLs, TLS files and duplicates at config time. See :mod:`.docker_pool`
for what the pool does with them.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from ..concurrency.limits import CapacityPermits, capacity_for
from ..config import ConfigPath, ParamsModel
from ..vocabulary.errors import PreflightError, SessionError

__all__ = [
    "PROBE_TIMEOUT",
    "Engine",
    "EngineParams",
    "EngineTLS",
    "check_engines",
    "copy_image",
    "docker_sdk",
    "engine_list",
    "engine_urls_as_mappings",
    "has_image",
    "reason",
    "remove_container",
]

#: Seconds a health probe may take before the engine counts as not answering.
PROBE_TIMEOUT = 10.0
_SCHEMES = ("unix", "tcp", "ssh", "http", "https")


@functools.cache
def _client_class() -> Any:
    """The SDK's ``DockerClient``, whose requests keep their TLS verification whatever the environment says.

    The SDK puts a TLS engine's ``ca_cert`` (or ``verify: false``) in its
    session's ``verify``, but requests lets ``REQUESTS_CA_BUNDLE`` and
    ``CURL_CA_BUNDLE`` override a session's setting for every request: on
    machines that set those (CI images, corporate setups) the engine's CA was
    ignored and the first call, made while the client is built, failed with
    "self-signed certificate in certificate chain" (``verify: false`` was
    turned back on the same way). ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``
    engines had it too. Proxies and the rest of the environment still apply.
    """
    docker = docker_sdk()

    class APIClientKeepingTLS(docker.APIClient):  # type: ignore[misc,name-defined]
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> Any:
            settings = super().merge_environment_settings(*args, **kwargs)
            if self.verify is False or isinstance(self.verify, str):  # verification off, or a CA file
                settings["verify"] = self.verify
            return settings

    class DockerClientKeepingTLS(docker.DockerClient):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:  # all the SDK's own __init__ does
            self.api = APIClientKeepingTLS(*args, **kwargs)

    return DockerClientKeepingTLS


class EngineTLS(ParamsModel):
    """TLS files of a ``tcp://`` engine (paths relative to the config file)."""

    ca_cert: ConfigPath | None = None
    client_cert: ConfigPath | None = None
    client_key: ConfigPath | None = None
    #: Check the engine's certificate against ``ca_cert`` (or the system's CAs).
    verify: bool = True

    @model_validator(mode="after")
    def _files(self) -> EngineTLS:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together")
        for name in ("ca_cert", "client_cert", "client_key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: no file at {path}")
        return self


class EngineParams(ParamsModel):
    """One engine of ``environment.params.engines``: a URL, or this mapping."""

    #: ``unix:///path/docker.sock``, ``tcp://host:2376`` or ``ssh://user@host``.
    url: str
    #: Sessions open at once on this engine, run-wide; ``0``: no limit.
    capacity: int = Field(default=0, ge=0)
    tls: EngineTLS | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme not in _SCHEMES:
            raise ValueError(f"{value!r} is not an engine URL (unix://, tcp:// or ssh://)")
        if scheme != "unix" and not urlsplit(value).hostname:
            raise ValueError(f"{value!r} names no host")
        return value

    @model_validator(mode="after")
    def _tls_for_tcp(self) -> EngineParams:
        if self.tls is not None and urlsplit(self.url).scheme not in ("tcp", "https"):
            raise ValueError(f"tls applies to tcp:// engines, not to {self.url!r}")
        return self


def engine_urls_as_mappings(value: Any) -> Any:
    """Before validation: a URL in ``engines`` stands for ``{url: URL}``."""
    if isinstance(value, list):
        return [{"url": v} if isinstance(v, str) else v for v in value]
    return value


def check_engines(engines: list[EngineParams] | None) -> list[EngineParams] | None:
    """After validation: a pool names each engine once, and at least one."""
    if engines is None:
        return None
    if not engines:
        raise ValueError("engines takes a non-empty list of engine URLs or {url, capacity, tls} mappings")
    seen: set[str] = set()
    for engine in engines:
        if engine.url in seen:
            raise ValueError(f"engine {engine.url!r} is listed twice")
        seen.add(engine.url)
    return engines


def engine_list(value: Any) -> list[EngineParams] | None:
    """``params.engines`` as :class:`EngineParams`, validated (for a provider built without assembly)."""
    if value is None:
        return None
    value = engine_urls_as_mappings(value)
    return check_engines([v if isinstance(v, EngineParams) else EngineParams.model_validate(v) for v in value])


def docker_sdk() -> Any:
    """The Docker SDK, imported on first use (it is heavy, and optional)."""
    try:
        import docker
    except ImportError:
        raise PreflightError(
            "the docker provider needs the Docker SDK: pip install 'pytest-agentcompass[docker]'"
        ) from None
    return docker


def reason(exc: BaseException) -> str:
    """``<type>: <first line>``, a long line kept at both ends.

    The SDK's connection errors put the cause last (``HTTPSConnectionPool(...):
    Max retries exceeded ... (Caused by SSLError(...: certificate verify
    failed: <why>))``): cutting the end off lost the one part worth reading.
    """
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines[0]) <= 240 else f"{lines[0][:80]} ... {lines[0][-150:]}"
    return f"{type(exc).__name__}: {text}"


class Engine:
    """One Docker engine: its client, its run-wide slots and whether it answers."""

    def __init__(self, spec: EngineParams | None) -> None:
        self.spec = spec
        #: ``None``: the environment's engine (``DOCKER_HOST`` or the local socket).
        self.url = spec.url if spec else os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        self.capacity = spec.capacity if spec else 0
        # Same kernel (a Unix socket): a timed-out exec's processes can also be killed from here.
        self.local = urlsplit(self.url).scheme == "unix"
        self.permits: CapacityPermits = capacity_for(f"docker-engine:{self.url}", self.capacity)
        #: Sessions placed here by this process and not closed yet (placement's load).
        self.assigned = 0
        self.down: str | None = None  # why it does not answer, while it does not
        #: Times it came back after not answering: what the engine held before (the keepalive's
        #: volume) may be gone, as from an engine restarted with fresh storage.
        self.comebacks = 0
        self.next_probe = 0.0
        #: Containers whose removal failed while the engine was down: removed when it answers.
        self.orphans: list[str] = []
        self._client: Any = None
        self._probe_client: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.url

    @property
    def incarnation(self) -> str:
        """What the runner made on the engine is keyed by this (its keepalive volume, the gateway's
        network, the images it built): the name, and which comeback once the engine came back after an
        outage, as it may be a fresh engine without any of it."""
        return f"{self.url}#{self.comebacks}" if self.comebacks else self.url

    def client(self) -> Any:
        """The SDK client (made on first use; blocking: call from a worker thread)."""
        with self._lock:
            if self._client is None:
                self._client = self._make(timeout=None)
            return self._client

    def _make(self, timeout: float | None) -> Any:
        docker = docker_sdk()
        if self.spec is None:
            return _client_class().from_env(timeout=int(timeout)) if timeout else _client_class().from_env()
        options: dict[str, Any] = {"base_url": self.url}
        if timeout:
            options["timeout"] = int(timeout)
        tls = self.spec.tls
        if tls is not None:
            cert = (str(tls.client_cert), str(tls.client_key)) if tls.client_cert and tls.client_key else None
            ca = str(tls.ca_cert) if tls.ca_cert else None
            options["tls"] = docker.tls.TLSConfig(client_cert=cert, ca_cert=ca, verify=tls.verify)
        if urlsplit(self.url).scheme == "ssh":
            # In process through paramiko (``~/.ssh/config``, keys, agent and ``known_hosts``
            # apply; an unknown host is refused): no ssh process per connection.
            options["use_ssh_client"] = False
        return _client_class()(**options)

    def probe(self) -> str | None:
        """Why the engine does not answer a ping within :data:`PROBE_TIMEOUT`, or ``None``."""
        try:
            with self._lock:
                if self._probe_client is None:
                    self._probe_client = self._make(timeout=PROBE_TIMEOUT)
                probe = self._probe_client
            probe.ping()
        except Exception as exc:
            return reason(exc)
        return None

    def close(self) -> None:
        with self._lock:
            clients, self._client, self._probe_client = (self._client, self._probe_client), None, None
        for client in clients:
            if client is not None:
                client.close()


#: ``opener(engine, config)``: opens the provider's session on ``engine``.


def has_image(client: Any, image: str) -> bool:
    try:
        client.images.get(image)
    except Exception as exc:
        if type(exc).__name__ in ("ImageNotFound", "NotFound"):
            return False
        raise
    return True


def copy_image(source: Any, target: Any, image: str) -> None:
    """``docker save image`` on ``source`` streamed into ``docker load`` on ``target``."""
    stream = source.api.get_image(image)
    target.api.load_image(stream)
    if not has_image(target, image):
        raise SessionError(f"loading image {image!r} did not produce it")


def remove_container(client: Any, container_id: str) -> None:
    try:
        client.api.remove_container(container_id, force=True, v=True)
    except Exception as exc:
        if type(exc).__name__ != "NotFound":
            raise
