#!/usr/bin/env bash
# The UFDA table (protocol msst: labeled source clients + one unlabeled target client) on
# digits-dg, 3 seeds x 4 targets, rows FedAvg source-only, centralized source-only, FADA,
# FACT-NF, FACT, plus the ablation FACT-NF without its target step (algo.adapt_target=false).
# Resumable: re-running continues an interrupted sweep and skips finished runs.
#   bash benchmarks/results/uda_table.sh [OUT_DIR] [ROUNDS]
# ROUNDS defaults to 30 (the README table). DEVICE=cuda runs on a GPU (default auto). FACT and
# FACT-NF use their default model fact-cnn (the official split, 25.7 M parameters: ~21-28 min
# per run on one CPU core). FACT's official schedule is 1000 rounds x 1 epoch
# on Digit-Five. FACT/FACT-NF use their own lr 0.005 and batch 128 (algo.lr,
# algo.batch_size); FedAvg, centralized and FADA use the run's lr 0.01 and batch 64.
# One torch thread per run (bit-identical results need the same thread count); on the 2-core
# CPU a 30-round run takes 3.5-6 min, the whole table ~4 h run as two parallel halves, e.g.
#   SEEDS=0,1 bash benchmarks/results/uda_table.sh runs/uda & SEEDS=2 bash benchmarks/results/uda_table.sh runs/uda
set -euo pipefail
out=${1:-runs/uda}; rounds=${2:-30}
seeds=${SEEDS:-0,1,2}; targets=${TARGETS:-mnistm,mnist,syn,optdigits}
rows=${ROWS:-fedavg,centralized,fada,fact-nf,fact}
# EXTRA: more run flags for every run (e.g. "--set client_data_fraction=0.02" for a smoke test)
read -r -a extra <<<"${EXTRA:-}"
common=(-d digits-dg --protocol msst --rounds "$rounds" --set threads=1
  --set device="${DEVICE:-auto}" --quiet ${extra[@]+"${extra[@]}"})
fedshift sweep -a "$rows" -t "$targets" --seeds "$seeds" "${common[@]}" --out "$out"
fedshift sweep -a fact-nf -t "$targets" --seeds "${ABLATION_SEEDS:-0}" "${common[@]}" \
  --set algo.adapt_target=false --out "$out-no-target-step"
for metric in target_accuracy target_accuracy_last target_accuracy_min_idd \
  target_accuracy_oracle bytes_per_round; do
  echo "## $metric"
  fedshift report "$out" --metric "$metric" --rows "$rows"
  echo
done
echo "## fact-nf without the target step (algo.adapt_target=false), target_accuracy"
fedshift report "$out-no-target-step" --metric target_accuracy
