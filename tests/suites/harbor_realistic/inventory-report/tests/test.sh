#!/bin/bash
# The other published verifier layout: a throwaway uv project beside /tests,
# pytest added to it, run through `uv run`; the exit code becomes the reward.

curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh

source $HOME/.local/bin/env

mkdir -p /tmp/test_workspace
cd /tmp/test_workspace

uv init
uv add pytest==8.4.1

uv run pytest /tests/test_outputs.py -rA
code=$?
if [ $code -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
