#!/usr/bin/env bash
# Bring up a local Docker engine (Debian's docker.io) and build the small test
# image the Docker provider's tests use. Idempotent: safe to run again.
# Needs root (or passwordless sudo): dockerd runs as root.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v busybox >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq docker.io busybox-static >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    # Not every machine has systemd: start the daemon directly, logging to a file.
    $SUDO sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &'
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/dockerd.log" >&2; tail -20 /var/log/dockerd.log >&2; exit 1; }
fi

# No registry is reachable: the test image is FROM scratch plus a static busybox.
if ! docker image inspect agentcompass-busybox:test >/dev/null 2>&1; then
    context=$(mktemp -d)
    trap 'rm -rf "$context"' EXIT
    cp "$(command -v busybox)" "$context/busybox"
    cat >"$context/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/mkdir", "-p", "/tmp", "/work", "/opt/verifier"]
ENV PATH=/bin
DOCKERFILE
    docker build -q -t agentcompass-busybox:test "$context" >/dev/null
fi
echo "docker engine ready: $(docker version --format '{{.Server.Version}}')"
