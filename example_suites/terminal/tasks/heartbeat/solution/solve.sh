#!/bin/bash
# The job outlives this script: the oracle returns when solve.sh does, the job keeps running.
( while :; do date +%s >> /app/heartbeat.log; sleep 1; done ) &
# Leave once it has beaten twice.
while [ "$(wc -l 2>/dev/null < /app/heartbeat.log || echo 0)" -lt 2 ]; do sleep 0.2; done
echo "heartbeat started"
