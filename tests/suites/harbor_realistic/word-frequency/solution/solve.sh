#!/bin/bash
# The counting lives in a helper next to this script; it must keep its executable bit.
set -e
/solution/rank.sh /app/data/corpus/notes.txt "$(sed -n 's/^TOP_N *= *//p' /app/settings.ini)" > /app/top_words.txt
