#!/usr/bin/env bash
# PACS leave-one-domain-out on the CPU from scratch: cnn, 32 px, 10 rounds, seed 0, five methods.
# Reads $FEDSHIFT_REAL_DATA/PACS (the official kfold lists). Usage: run.sh [OUT]
set -euo pipefail
data="${FEDSHIFT_REAL_DATA:?set FEDSHIFT_REAL_DATA to the folder holding PACS/}"
bash "$(dirname "$0")/../../benchmarks/results/pacs_cpu_table.sh" "$data/PACS" "${1:-runs/pacs32}"
