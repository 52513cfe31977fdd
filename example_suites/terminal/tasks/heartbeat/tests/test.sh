#!/bin/bash
# Published verifiers refuse to run from /: they expect the image's WORKDIR.
if [ "$PWD" = "/" ]; then echo "Error: no working directory set" >&2; exit 1; fi
mkdir -p /logs/verifier
# The job left its trace: at least two beats, each a Unix time. (With the shared verifier it
# is still running; a snapshot or a separate verifier sees what it wrote before it was stopped.)
beats=$(grep -c '^[0-9][0-9]*$' /app/heartbeat.log 2>/dev/null || echo 0)
echo "beats: $beats"
if [ "$beats" -ge 2 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
