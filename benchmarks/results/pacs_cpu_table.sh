#!/usr/bin/env bash
# The first real-data table: PACS leave-one-domain-out on the CPU, every method from scratch
# (no ImageNet weights can be had here), at a setting a 2-core CPU affords: 32 px images, the
# run's default CNN, 10 rounds, seed 0, source-validation selection, DomainBed's augmentation
# (PIL backend on the CPU). Two runs at once, one thread each; resumable (run it again to
# continue an interrupted table).
#   bash benchmarks/results/pacs_cpu_table.sh PACS_ROOT [OUT]      (PACS_ROOT holds the official kfold)
# SEEDS (default 0) and JOBS (default 2) override.
set -euo pipefail
data_root=${1:?usage: pacs_cpu_table.sh PACS_ROOT [OUT]}
out=${2:-runs/pacs32}
methods=fedavg,centralized,fedsr,ccst,feddg-elcfs
fedshift sweep -a "$methods" -t sketch,art_painting,cartoon,photo --seeds "${SEEDS:-0}" -d pacs \
  --rounds 10 --set data_root="$data_root" --set image_size=32 --set threads=1 \
  --jobs "${JOBS:-2}" --out "$out" --quiet > /dev/null
echo "### target accuracy (%), round selected by source validation"
fedshift report "$out" --rows "$methods"
echo
echo "### target accuracy (%), last round"
fedshift report "$out" --rows "$methods" --metric target_accuracy_last
echo
echo "### CPU cost per run (10 rounds; from the rounds that recorded cpu_seconds)"
python3 "$(dirname "$0")/run_cpu_cost.py" "$out" 10
