#!/bin/bash
wc -l < data.txt | tr -d ' ' > count.txt
