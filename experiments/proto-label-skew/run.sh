#!/usr/bin/env bash
# Prototype methods under label skew (FedProto, BD-FedProto, MOON vs FedAvg and local, and the
# heterogeneous-model rows), 3 seeds, 50 rounds. Usage: run.sh [OUT_ROOT]
set -euo pipefail
bash "$(dirname "$0")/../../benchmarks/results/method_tables.sh" "${1:-runs/tables}" label-skew
