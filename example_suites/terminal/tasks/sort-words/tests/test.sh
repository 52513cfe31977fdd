#!/bin/bash
# Published verifiers refuse to run from /: they expect the image's WORKDIR.
if [ "$PWD" = "/" ]; then echo "Error: no working directory set" >&2; exit 1; fi
mkdir -p /logs/verifier
# No "reward" key: the score is the mean of the checks.
sorted=0; unique=0
[ "$(cat /app/sorted.txt 2>/dev/null)" = "$(sort /app/words.txt)" ] && sorted=1
[ "$(cat /app/sorted.txt 2>/dev/null)" = "$(sort -u /app/words.txt)" ] && unique=1
[ "$unique" = 1 ] && sorted=1
printf '{"sorted": %s, "unique": %s}\n' $sorted $unique > /logs/verifier/reward.json
