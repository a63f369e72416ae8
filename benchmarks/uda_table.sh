#!/usr/bin/env bash
# The UFDA table (protocol msst: labeled source clients + one unlabeled target client) on
# digits-dg, 3 seeds x 4 targets, rows FedAvg source-only, centralized source-only, FADA,
# FACT-NF, FACT. Resumable: re-running continues an interrupted sweep.
#   bash benchmarks/uda_table.sh [OUT_DIR] [ROUNDS]
# FACT's official schedule is 1000 rounds x 1 epoch on Digit-Five; ROUNDS defaults to 100
# to fit a CPU budget. FACT/FACT-NF use their own lr 0.005 and batch 128 (algo.lr,
# algo.batch_size); FedAvg, centralized and FADA use the run's lr 0.01 and batch 64.
set -euo pipefail
out=${1:-runs/uda}; rounds=${2:-100}
rows=fedavg,centralized,fada,fact-nf,fact
fedshift sweep -a "$rows" -t mnistm,mnist,syn,optdigits --seeds 0,1,2 -d digits-dg \
  --protocol msst --rounds "$rounds" --out "$out" --quiet
for metric in target_accuracy_last target_accuracy target_accuracy_min_idd \
  target_accuracy_oracle bytes_per_round; do
  echo "## $metric"
  fedshift report "$out" --metric "$metric" --rows "$rows"
  echo
done
