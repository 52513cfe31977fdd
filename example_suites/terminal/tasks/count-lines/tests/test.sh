#!/bin/bash
# Published verifiers refuse to run from /: they expect the image's WORKDIR.
if [ "$PWD" = "/" ]; then echo "Error: no working directory set" >&2; exit 1; fi
mkdir -p /logs/verifier
expected=$(wc -l < /app/data.txt | tr -d ' ')
got=$(tr -d ' \n' < /app/count.txt 2>/dev/null)
if [ -n "$got" ] && [ "$got" = "$expected" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
echo "expected $expected, got '${got}'"
