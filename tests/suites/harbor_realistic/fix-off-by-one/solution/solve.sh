#!/bin/bash
set -e
sed -i 's/start = number \* size/start = (number - 1) * size/' pager/pager.py
