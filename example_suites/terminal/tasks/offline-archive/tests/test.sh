#!/bin/bash
# Published verifiers refuse to run from /: they expect the image's WORKDIR.
if [ "$PWD" = "/" ]; then echo "Error: no working directory set" >&2; exit 1; fi
mkdir -p /logs/verifier
mkdir -p /tmp/check && cd /tmp/check
if tar -xzf /app/project.tar.gz 2>/dev/null && cmp -s project/README /app/project/README && cmp -s project/src/main.txt /app/project/src/main.txt; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
