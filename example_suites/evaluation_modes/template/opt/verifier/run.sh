#!/bin/sh
# Fresh-mode verifier: apply the submitted patch to a pristine copy and check it.
set -eu
patch="$1"
test -s "$patch" || { echo "empty submission"; exit 2; }
cd "$(dirname "$0")/../project"
grep -q '^+status = "fixed"$' "$patch" && echo "patch fixes the bug" || { echo "patch does not fix the bug"; exit 1; }
