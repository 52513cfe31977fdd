#!/bin/bash
# SORT_FLAGS comes from [solution] env in task.toml.
sort $SORT_FLAGS words.txt > sorted.txt
