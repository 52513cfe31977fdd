#!/bin/bash
tr 'A-Z' 'a-z' < "$1" | grep -oE '[a-z]+' | sort | uniq -c | awk '{print $2, $1}' | sort -k2,2nr -k1,1 | head -n "$2"
