"""Extra Docker engines for tests: each a ``dockerd`` in a network namespace of its own.

A second ``dockerd`` in the host's namespace would delete the main engine's
``docker0`` bridge, so every engine here gets its own namespace, socket, data
root and exec root, no bridge and no iptables rules. Sessions on them use
``network_mode: none`` (the tests deny the network in every phase).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

IMAGE = "agentcompass-busybox:test"
#: Seconds an engine may take to answer after it starts (a loaded machine is slow).
START_TIMEOUT = 120.0


class Unavailable(Exception):
    """Extra engines cannot run here (the reason is the message)."""


def _run(*argv: str, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, **kwargs)  # type: ignore[call-overload, no-any-return]


class ExtraEngine:
    """One ``dockerd`` under ``root`` in network namespace ``netns``."""

    def __init__(self, root: Path, netns: str) -> None:
        self.root = root
        self.netns = netns
        self.url = f"unix://{root}/docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.root / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/var/run/netns/{self.netns}",
                "dockerd",
                "--host",
                self.url,
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "--pidfile",
                str(self.root / "dockerd.pid"),
                "--bridge=none",
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # a test process killed outright takes its engines along
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-1500:]
                self.stop()
                raise Unavailable(f"dockerd did not start in netns {self.netns}:\n{tail}")
            time.sleep(0.2)

    def _answers(self) -> bool:
        """Whether the engine answers, asked with a bound: a half-started daemon accepted and never answered
        (a restarted engine's ``docker version`` hung a test run for over an hour)."""
        try:
            return _run("docker", "-H", self.url, "version", check=False, timeout=15).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("docker", "-H", self.url, *args, check=check)

    def containers(self, label: str = "agentcompass") -> list[str]:
        return self.docker("ps", "-aq", "--filter", f"label={label}").stdout.split()

    def kill(self) -> None:
        """SIGKILL the daemon (an engine that dies): its containers stay until it restarts."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        # Its containerd too (as when the machine goes): a survivor would keep the next one from starting.
        for pid in _processes_mentioning(f"{self.root}/exec/containerd/containerd.toml"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Reaped by nobody here (no init), its pid stays a zombie, which the next dockerd takes
        # for a live containerd ("containerd is still running") and waits on forever.
        (self.root / "exec/containerd/containerd.pid").unlink(missing_ok=True)
        self.proc = None

    def lose_storage(self) -> None:
        """Of a killed engine: every image, container and volume gone, as on a machine that comes back
        with new disks (the next :meth:`start` is a fresh engine at the same address)."""
        assert self.proc is None, "kill the engine first"
        _unmount_under(self.root)  # a killed daemon leaves its containers' mounts
        shutil.rmtree(self.root / "data")

    def stop(self) -> None:
        """Stop the daemon (it stops its containers and its containerd)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Engines:
    """Two extra engines with the test image; ``close`` removes every trace of them."""

    def __init__(self, count: int = 2) -> None:
        for tool in ("dockerd", "nsenter", "ip", "docker"):
            if shutil.which(tool) is None:
                raise Unavailable(f"{tool} is not installed")
        if os.geteuid() != 0:
            raise Unavailable("starting dockerd needs root")
        _sweep_dead_sessions()
        # Short: a Unix socket path is limited to 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="acpool-", dir="/tmp"))
        (self.root / "owner").write_text(_process_key(os.getpid()))
        self.engines: list[ExtraEngine] = []
        self.netns: list[str] = []
        try:
            image = self.root / "image.tar"
            _run("docker", "save", "-o", str(image), IMAGE)
            for index in range(count):
                name = f"{self.root.name}-{index}"
                added = _run("ip", "netns", "add", name, check=False)
                if added.returncode != 0:
                    raise Unavailable(f"ip netns add failed: {added.stderr.strip()}")
                self.netns.append(name)
                _run("nsenter", f"--net=/var/run/netns/{name}", "ip", "link", "set", "lo", "up")
                folder = self.root / f"e{index}"
                folder.mkdir()
                engine = ExtraEngine(folder, name)
                self.engines.append(engine)
                engine.start()
                engine.docker("load", "-i", str(image))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for engine in self.engines:
            engine.stop()
        _remove_traces(self.root, self.netns)


def _unmount_under(root: Path) -> None:
    """Unmount whatever is mounted under ``root``. dockerd mounts its data root on itself and each
    container's network namespace under its exec root; a killed daemon leaves them mounted (deepest
    first, so parents come free)."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), reverse=True):
        _run("umount", "--lazy", mount, check=False)


def _remove_traces(root: Path, netns: list[str]) -> None:
    """Every trace of the engines under ``root``: mounts, leftover processes, namespaces, files."""
    _unmount_under(root)
    for pid in _processes_mentioning(f"{root}/"):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in netns:
        _run("ip", "netns", "del", name, check=False)
    shutil.rmtree(root, ignore_errors=True)


def _process_key(pid: int) -> str:
    """``pid`` and its start time: a pid the kernel hands out again does not match."""
    try:
        return f"{pid} {Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return ""


def _sweep_dead_sessions() -> None:
    """Remove the engines of test sessions that were killed (``close`` never ran for them).

    A session killed outright takes its daemons along (``PR_SET_PDEATHSIG``)
    but leaves their namespaces, mounts and folder; one still running
    (another clone's suite on this machine) is left alone.
    """
    netns = Path("/var/run/netns")
    for root in Path("/tmp").glob("acpool-*"):
        try:
            owner = (root / "owner").read_text()
        except FileNotFoundError:
            owner = ""  # made before its owner was written, or by an older suite: judged by age
            if time.time() - root.stat().st_mtime < 3600:
                continue
        except OSError:
            continue
        if owner and _process_key(int(owner.split()[0])) == owner:
            continue
        names = [entry.name for entry in netns.glob(f"{root.name}-*")] if netns.is_dir() else []
        _remove_traces(root, names)


def _die_with_parent() -> None:
    """SIGTERM this child (nsenter, then the dockerd it becomes) when the process that started it dies."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line holds ``text`` (the shims of one engine's exec root)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


class TcpProxy:
    """A loopback TCP port forwarding to a Unix socket: a ``tcp://`` engine for tests.

    With ``tls`` (a server context) it speaks TLS to its clients, as an
    engine started with ``--tlsverify`` does, and forwards in the clear.
    """

    def __init__(self, unix_path: str, tls: ssl.SSLContext | None = None) -> None:
        self.unix_path = unix_path
        self.tls = tls
        #: Handshakes refused (a client without an accepted certificate, or one that refused ours).
        self.refused: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"tcp://127.0.0.1:{self.port}"
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        if self.tls is not None:
            try:  # the handshake here, not in the accepting thread: a stalled client must not stop the others
                client = self.tls.wrap_socket(client, server_side=True)
            except (OSError, ssl.SSLError) as exc:
                self.refused.append(str(exc))
                client.close()
                return
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(self.unix_path)
        except OSError:
            client.close()
            upstream.close()
            return
        ends = threading.Semaphore(0)  # released once per direction that has ended
        for source, target in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(source, target, ends), daemon=True).start()
        threading.Thread(target=_close_after, args=(ends, client, upstream), daemon=True).start()

    def close(self) -> None:
        # Wake the accepting thread and wait for it before the socket's number is
        # freed: a thread still accepting on that number would take the
        # connections of whatever socket gets it next (another test's server).
        self._closed = True
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=30)
        self.server.close()


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with ``openssl``.

    Returns their paths: ``ca``, ``server_cert``, ``server_key``, ``client_cert``, ``client_key``.
    """
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
            "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")  # fmt: skip
    return {
        "ca": folder / "ca.pem",
        "server_cert": folder / "server.pem",
        "server_key": folder / "server.key",
        "client_cert": folder / "client.pem",
        "client_key": folder / "client.key",
    }


def server_context(certs: dict[str, Path]) -> ssl.SSLContext:
    """What ``dockerd --tlsverify`` checks: our server certificate, and clients signed by the CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs["ca"]))
    context.load_cert_chain(str(certs["server_cert"]), str(certs["server_key"]))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _pipe(source: socket.socket, target: socket.socket, ends: threading.Semaphore) -> None:
    """Copy one direction; its end is passed on as a half-close, so the other direction
    (an exec's output still on its way) is not cut short."""
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        try:
            # The plain socket's shutdown: an SSLSocket's own drops its TLS state,
            # and the other direction would then read raw records.
            socket.socket.shutdown(target, socket.SHUT_WR)
        except OSError:
            pass
        ends.release()


def _close_after(ends: threading.Semaphore, *socks: socket.socket) -> None:
    """Close a proxied connection once both directions have ended."""
    ends.acquire()
    ends.acquire()
    for sock in socks:
        sock.close()


class SshLoopback:
    """``sshd`` on a loopback port whose only key logs in as root with ``DOCKER_HOST`` set to
    ``engine_url``: ``ssh://root@127.0.0.1:PORT`` is then that engine, as a remote one would be.

    ``home`` is the client side (``.ssh`` with the key, ``known_hosts`` and a config): run the
    client with ``HOME`` pointing there.
    """

    def __init__(self, root: Path, engine_url: str) -> None:
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not Path(sshd).exists():
            raise Unavailable("openssh-server is not installed (apt-get install openssh-server)")
        self.root = root
        self.home = root / "home"
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_dir / "id_ed25519"))
        public = (ssh_dir / "id_ed25519.pub").read_text().strip()
        (root / "authorized_keys").write_text(f'environment="DOCKER_HOST={engine_url}" {public}\n')
        with socket.create_server(("127.0.0.1", 0)) as probe:
            self.port = probe.getsockname()[1]
        host_key = (root / "host_key.pub").read_text().split()
        (ssh_dir / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        (root / "sshd_config").write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {root / 'host_key'}\n"
            f"PidFile {root / 'sshd.pid'}\nAuthorizedKeysFile {root / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nPermitUserEnvironment yes\n"
            "StrictModes no\nUsePAM no\nMaxSessions 100\nMaxStartups 100\n"
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # its privilege separation directory
        self.proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(root / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=(root / "sshd.log").open("wb"),
            start_new_session=True,
        )
        self.url = f"ssh://root@127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise Unavailable(f"sshd did not start: {(root / 'sshd.log').read_text()[-800:]}") from None
                time.sleep(0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the listener and the connections it forked
            self.proc.wait()
