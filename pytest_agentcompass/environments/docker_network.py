"""The internal Docker network through which containers reach the model gateway, and only it.

One network per provider and engine, made when the first attempt opens a
gateway grant: ``internal`` (the engine routes nothing beyond it, so no
internet and no DNS), with inter-container traffic off (attempts sharing it
cannot reach each other), labelled like the run's containers. A container
joins it for the run phase only (``DockerSession.join_network``) and the
gateway listens on the network's gateway address, which is this host's.

That address is the host's own, so a container could also reach every
service of this machine that listens on all addresses, and through the
host's routing its other addresses. Where this process may (root, an
``iptables`` command, the engine's bridge in this network namespace), a
firewall closes that: the host accepts nothing from the network's bridge but
the gateway's port (``gateway_firewall: auto``, the default; ``required``
fails the attempt where it cannot, ``off`` never tries). Its rules carry the
run id in a comment, so a resume removes what a killed run left, like the
networks (by label).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shlex
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..vocabulary.errors import PolicyError, SessionError
from .base import HostRoute

__all__ = ["FirewallMode", "GatewayNetwork", "GatewayNetworks", "sweep_firewall", "sweep_gateway", "sweep_networks"]

log = logging.getLogger("pytest_agentcompass")

FirewallMode = Literal["auto", "required", "off"]
#: Marks the networks (label) and firewall rules (comment prefix) of the gateway.
GATEWAY_LABEL = "agentcompass.gateway"
_RULE_TAG = "agentcompass-gw"


@dataclass
class GatewayNetwork:
    """One internal network on one engine, and the host's side of it."""

    client: Any
    name: str
    gateway: str
    bridge: str
    tag: str | None = None  # the firewall rules' comment, when the firewall is on
    admitted: set[int] = field(default_factory=set)

    def admit(self, port: int) -> None:
        """Let the network's containers reach the gateway's ``port`` (the one opening in the firewall)."""
        if self.tag is None or port in self.admitted:
            return
        rule = ["-i", self.bridge, "-d", self.gateway, "-p", "tcp", "--dport", str(port), *_comment(self.tag)]
        _iptables("-I", "INPUT", "1", *rule, "-j", "ACCEPT")
        self.admitted.add(port)

    def remove(self) -> None:
        """Remove the firewall rules, detach what is still attached, and remove the network."""
        try:
            if self.tag is not None:
                _remove_rules(self.tag)
        finally:
            _remove_network(self.client, self.name)


class GatewayNetworks:
    """A provider's gateway networks, one per engine, made on first use and removed by :meth:`close`."""

    def __init__(self, mode: FirewallMode, notes: list[str]) -> None:
        self.mode = mode
        self.notes = notes
        self._networks: dict[str, GatewayNetwork] = {}
        self._lock = threading.Lock()

    async def route(self, container: Any, engine: Any, labels: dict[str, str]) -> HostRoute:
        """Attach ``container`` (a ``DockerSession`` on ``engine``) to the engine's gateway network.

        :raises SessionError: for an engine on another machine (the gateway listens on the host
            of the network), or when the network cannot be made or joined.
        """
        if not hasattr(container, "join_network"):
            raise PolicyError(f"{container.describe()} is no container of the docker provider")
        if not engine.local:
            raise SessionError(
                f"the model gateway cannot reach containers of the remote Docker engine {engine.name}: "
                "it listens on the host of the container's network, which must be this machine"
            )
        network = await asyncio.to_thread(self.ensure, engine.incarnation, container.client, labels)
        await asyncio.to_thread(container.join_network, network.name)

        async def admit(port: int) -> None:
            await asyncio.to_thread(network.admit, port)

        async def release() -> None:
            await asyncio.to_thread(container.leave_network, network.name)

        return HostRoute(listen=network.gateway, host=network.gateway, admit=admit, release=release)

    def ensure(self, engine: str, client: Any, labels: dict[str, str]) -> GatewayNetwork:
        """The network on ``engine`` (its :attr:`~.docker_engine.Engine.incarnation`), made now if it does
        not exist yet (in a worker thread)."""
        with self._lock:
            network = self._networks.get(engine)
            if network is None:
                network = self._networks[engine] = self._create(client, labels)
            return network

    def _create(self, client: Any, labels: dict[str, str]) -> GatewayNetwork:
        suffix = secrets.token_hex(5)
        bridge = f"acgw{suffix}"  # at most 15 characters, the kernel's limit for an interface name
        made = client.networks.create(
            f"agentcompass-gateway-{suffix}",
            driver="bridge",
            internal=True,
            labels={"agentcompass": "1", GATEWAY_LABEL: "1", **labels},
            options={"com.docker.network.bridge.enable_icc": "false", "com.docker.network.bridge.name": bridge},
        )
        try:
            made.reload()
            config = (made.attrs.get("IPAM") or {}).get("Config") or [{}]
            gateway = config[0].get("Gateway")
            if not gateway:
                raise SessionError(f"the Docker network {made.name} has no gateway address")
            network = GatewayNetwork(client, made.name, str(gateway).split("/")[0], bridge)
            problem = firewall_problem(bridge) if self.mode != "off" else None
            if problem is None and self.mode != "off":
                network.tag = f"{_RULE_TAG}:{labels.get('agentcompass.run', 'norun')}:{bridge}"
                _iptables("-I", "INPUT", "1", "-i", bridge, *_comment(network.tag), "-j", "REJECT")
            elif problem is not None:
                self._unguarded(problem)
            return network
        except BaseException:
            _remove_network(client, made.name)
            raise

    def _unguarded(self, problem: str) -> None:
        message = (
            f"the model gateway's network cannot be firewalled ({problem}): its containers can reach "
            "every service this machine listens on at all addresses, not only the gateway"
        )
        if self.mode == "required":
            raise SessionError(f"{message}; environment.params.gateway_firewall is 'required'")
        if message not in self.notes:
            log.warning("%s", message)
            self.notes.append(message)

    async def close(self) -> None:
        """Remove every network (and its firewall rules); failures are warnings."""
        with self._lock:
            networks, self._networks = list(self._networks.values()), {}
        for network in networks:
            try:
                await asyncio.to_thread(network.remove)
            except Exception as exc:
                log.warning("the model gateway's network %s was not removed: %s", network.name, exc)


def firewall_problem(bridge: str) -> str | None:
    """Why this process cannot firewall ``bridge``, or ``None`` when it can."""
    if not Path("/sys/class/net", bridge).exists():
        return f"its bridge {bridge} is not in this machine's network namespace"
    if os.geteuid() != 0:
        return "this process is not root"
    if shutil.which("iptables") is None:
        return "no iptables command"
    return None


async def sweep_gateway(engines: list[Any], run_id: str) -> int:
    """Remove the gateway networks and firewall rules a killed run left (the engines' containers are gone)."""
    removed = 0
    for engine in engines:
        try:
            removed += await asyncio.to_thread(sweep_networks, engine.client(), run_id)
        except Exception as exc:
            log.warning("Docker engine %s: the gateway networks of run %s were not swept: %s", engine.name, run_id, exc)
    return removed + await asyncio.to_thread(sweep_firewall, run_id)


def sweep_networks(client: Any, run_id: str) -> int:
    """Remove the gateway networks a killed run ``run_id`` left on the engine of ``client``."""
    found = client.networks.list(filters={"label": [GATEWAY_LABEL, f"agentcompass.run={run_id}"]})
    for network in found:
        _remove_network(client, network.name)
    return len(found)


def sweep_firewall(run_id: str) -> int:
    """Remove the firewall rules of run ``run_id`` (0 when this process cannot see or change them)."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        return 0
    return _remove_rules(f"{_RULE_TAG}:{run_id}:")


def _comment(tag: str | None) -> list[str]:
    return ["-m", "comment", "--comment", str(tag)]


def _iptables(*args: str) -> str:
    done = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode:
        raise SessionError(f"iptables {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def _remove_rules(tag: str) -> int:
    """Delete every INPUT rule whose comment starts with ``tag``."""
    removed = 0
    for line in _iptables("-S", "INPUT").splitlines():
        words = shlex.split(line)
        if words[:2] == ["-A", "INPUT"] and any(w.startswith(tag) for w in words):
            _iptables("-D", *words[1:])
            removed += 1
    return removed


def _remove_network(client: Any, name: str) -> None:
    try:
        network = client.networks.get(name)
    except Exception as exc:
        if type(exc).__name__ == "NotFound":
            return
        raise
    for container in (network.attrs.get("Containers") or {}).keys():
        try:
            network.disconnect(container, force=True)
        except Exception as exc:
            if type(exc).__name__ != "NotFound":
                raise
    network.remove()
