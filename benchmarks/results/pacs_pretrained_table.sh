#!/usr/bin/env bash
# PACS in the papers' regime on the CPU: leave-one-domain-out from ImageNet-pretrained
# EfficientNet-Lite0 (extra `pretrained`; the papers use ResNet-18/50 at 224 px), at what a
# 2-core CPU affords: 96 px, 5 rounds of one local epoch, channels_last, seed 0,
# source-validation selection, DomainBed's augmentation (PIL backend on the CPU). Resumable:
# run it again to continue; finished runs are kept.
#   bash benchmarks/results/pacs_pretrained_table.sh PACS_ROOT [OUT]
# METHODS (default the six of the table), TARGETS, SEEDS (default 0), JOBS (default 2).
set -euo pipefail
data_root=${1:?usage: pacs_pretrained_table.sh PACS_ROOT [OUT]}
out=${2:-runs/pacs-lite0}
methods=${METHODS:-fedavg,centralized,fedsr,ccst,feddg-elcfs,fedga}
fedshift sweep -a "$methods" -t "${TARGETS:-sketch,photo,cartoon,art_painting}" \
  --seeds "${SEEDS:-0}" -d pacs --rounds 5 --model efficientnet-lite0 \
  --set model_weights=imagenet --set image_size=96 --set channels_last=on \
  --set data_root="$data_root" --set threads=1 --jobs "${JOBS:-2}" --out "$out" --quiet > /dev/null
echo "### target accuracy (%), round selected by source validation"
fedshift report "$out" --rows "$methods"
echo
echo "### target accuracy (%), last round"
fedshift report "$out" --rows "$methods" --metric target_accuracy_last
echo
echo "### CPU cost per run"
python3 "$(dirname "$0")/run_cpu_cost.py" "$out" 5
