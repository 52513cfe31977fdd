#!/usr/bin/env bash
# Build, without any registry, the base images published Harbor / Terminal-Bench
# tasks start FROM (ubuntu:24.04, python:3.1x-slim, ...): one Debian bookworm
# root file system (mmdebstrap, from the Debian mirror) with python3, pytest,
# bash and the usual tools, imported once; then a small layer (base-image/)
# with an offline uv/uvx stand-in, tagged under every name below.
# Idempotent and quick when the images exist. Needs root (or sudo) for apt.
#
#   scripts/build-base-images.sh            # the default names
#   scripts/build-base-images.sh NAME...    # tag these names too
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# Bump VERSION when the root file system changes, TOOLS when base-image/ does:
# names tagged from an older build are moved.
VERSION=3
TOOLS=3
ROOTFS="agentcompass-base:bookworm-v$VERSION"
BASE="agentcompass-base:bookworm-v$VERSION-tools$TOOLS"
LABEL="org.agentcompass.base"
HERE="$(cd "$(dirname "$0")" && pwd)"
NAMES=(ubuntu:24.04 ubuntu:22.04 ubuntu:latest debian:bookworm debian:bookworm-slim debian:12 debian:12-slim
       python:3.11-slim python:3.12-slim python:3.13-slim python:3.11 python:3.12 python:3.13
       python:3.11-slim-bookworm python:3.12-slim-bookworm python:3.13-slim-bookworm
       python:3.11-bookworm python:3.12-bookworm python:3.13-bookworm "$@")
PACKAGES="bash,coreutils,ca-certificates,curl,wget,git,procps,python3,python3-pytest,python3-pip,python3-venv,jq,less,patch,diffutils,findutils,grep,sed,gawk,tar,gzip,xz-utils,file,unzip"
# The pytest published verifiers pin, and the CTRF report plugin they call
# (pytest --ctrf ...; it needs pytest 8). Best effort: fetched with the host's
# pip when it reaches an index, else the image keeps Debian's pytest 7 alone.
WHEELS="pytest==8.4.1 pytest-json-ctrf==0.3.5"

if ! docker image inspect "$ROOTFS" >/dev/null 2>&1; then
    if ! command -v mmdebstrap >/dev/null 2>&1; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mmdebstrap >/dev/null
    fi
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir "$work/wheels"
    # shellcheck disable=SC2086
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version 3.11 \
        -d "$work/wheels" $WHEELS 2>/dev/null \
        || { echo "note: could not fetch $WHEELS; the base image goes without" >&2; rm -f "$work"/wheels/*; }
    # Like the python: images, pip installs system-wide (no PEP 668 refusal);
    # `python` is python3. --customize-hook runs with the root file system in "$1".
    $SUDO mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        --customize-hook='chroot "$1" ln -sf /usr/bin/python3 /usr/local/bin/python' \
        --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp -r $work/wheels/. \"\$1/tmp/wheels/\"" \
        --customize-hook='if ls "$1"/tmp/wheels/*.whl >/dev/null 2>&1; then chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -c "python3 -m pip install --quiet --root-user-action=ignore --no-index --find-links /tmp/wheels '"$WHEELS"'"; fi; rm -rf "$1/tmp/wheels"' \
        --customize-hook='chroot "$1" sh -c "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /root/.cache"' \
        bookworm "$work/rootfs.tar"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change "LABEL $LABEL=$VERSION" \
        --change 'CMD ["bash"]' \
        "$work/rootfs.tar" "$ROOTFS" >/dev/null
fi
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    docker build --quiet --build-arg "ROOTFS=$ROOTFS" --label "$LABEL=$VERSION-tools$TOOLS" \
        -t "$BASE" "$HERE/base-image" >/dev/null
fi

ours() {  # the name exists and was tagged by this script (any version)
    [ -n "$(docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null)" ] \
        || [ "$(docker image inspect -f '{{.Id}}' "$1" 2>/dev/null)" = \
             "$(docker image inspect -f '{{.Id}}' agentcompass-base:bookworm 2>/dev/null || echo none)" ]
}
for name in "${NAMES[@]}"; do
    # Never overwrite an image that is really the upstream one (pulled by someone).
    if ! docker image inspect "$name" >/dev/null 2>&1 || ours "$name"; then
        docker tag "$BASE" "$name"
    fi
done
echo "base images ready: $BASE as ${NAMES[*]}"
