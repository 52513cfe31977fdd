#!/bin/bash
# Published verifiers refuse to run from /: they expect the image's WORKDIR.
if [ "$PWD" = "/" ]; then echo "Error: no working directory set" >&2; exit 1; fi
mkdir -p /logs/verifier
port=0; logging=0; kept=0
grep -qx "port=$EXPECTED_PORT" /app/service.conf && port=1
grep -qx "logging=on" /app/service.conf && logging=1
grep -qx "name=demo" /app/service.conf && grep -qx "workers=4" /app/service.conf && kept=1
reward=0; [ $port$logging$kept = 111 ] && reward=1
# Named numbers: the score is "reward"; the others are recorded and aggregated too.
printf '{"reward": %s, "port": %s, "logging": %s, "kept_lines": %s}\n' $reward $port $logging $kept > /logs/verifier/reward.json
