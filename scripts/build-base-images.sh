#!/usr/bin/env bash
# Build, without any registry, the base images published Harbor / Terminal-Bench
# tasks start FROM (ubuntu:24.04, python:3.1x-slim, ...): one Debian bookworm
# root file system (mmdebstrap, from the Debian mirror) with python3, pytest,
# bash and the usual tools, imported once and tagged under every name below.
# Idempotent and quick when the images exist. Needs root (or sudo) for apt.
#
#   scripts/build-base-images.sh            # the default names
#   scripts/build-base-images.sh NAME...    # tag these names too
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

BASE="agentcompass-base:bookworm"
NAMES=(ubuntu:24.04 ubuntu:22.04 debian:bookworm debian:bookworm-slim
       python:3.11-slim python:3.12-slim python:3.13-slim python:3.12 python:3.11 "$@")
PACKAGES="bash,coreutils,ca-certificates,curl,wget,git,procps,python3,python3-pytest,python3-pip,python3-venv,jq,less,patch,diffutils,findutils,grep,sed,gawk,tar,gzip,xz-utils,file"

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    if ! command -v mmdebstrap >/dev/null 2>&1; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mmdebstrap >/dev/null
    fi
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # minbase keeps it small; python3-is-python3 is not in bookworm, so link python below.
    $SUDO mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
        --customize-hook='chroot "$1" ln -sf /usr/bin/python3 /usr/local/bin/python' \
        --customize-hook='chroot "$1" sh -c "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin"' \
        bookworm "$work/rootfs.tar"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        "$work/rootfs.tar" "$BASE" >/dev/null
fi

for name in "${NAMES[@]}"; do
    # Never overwrite an image that is really the upstream one (pulled by someone).
    if ! docker image inspect "$name" >/dev/null 2>&1; then
        docker tag "$BASE" "$name"
    fi
done
echo "base images ready: $BASE as ${NAMES[*]}"
