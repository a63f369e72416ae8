#!/usr/bin/env bash
# FPL (and its paper-UPCR ablation) vs FedAvg and local under the per-domain protocol,
# 3 seeds, 30 rounds. Usage: run.sh [OUT_ROOT]
set -euo pipefail
bash "$(dirname "$0")/../../benchmarks/results/method_tables.sh" "${1:-runs/tables}" per-domain
