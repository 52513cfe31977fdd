#!/bin/bash
# Proof the agent phase is offline: the network has no interface besides lo.
ls /sys/class/net > /logs/agent/interfaces.txt
tar -czf project.tar.gz project
