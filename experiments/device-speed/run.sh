#!/usr/bin/env bash
# Seconds per round on the CPU and on a CUDA GPU for seven algorithms, digits-dg, target
# mnistm (run it on a machine with a GPU). Usage: run.sh [OUT]  (writes OUT/device_speed.txt)
set -euo pipefail
out="${1:-runs/device-speed}"
mkdir -p "$out"
python "$(dirname "$0")/../../benchmarks/speed/device_speed.py" | tee "$out/device_speed.txt"
