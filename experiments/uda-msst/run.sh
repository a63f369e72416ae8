#!/usr/bin/env bash
# Unsupervised federated domain adaptation (protocol msst) on digits-dg: FedAvg and centralized
# source only, FADA, FACT-NF, FACT; 3 seeds x 4 targets, 30 rounds, and the FACT-NF ablation
# without its target step. Usage: run.sh [OUT]
set -euo pipefail
bash "$(dirname "$0")/../../benchmarks/results/uda_table.sh" "${1:-runs/uda}" 30
