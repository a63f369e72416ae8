#!/usr/bin/env bash
# PACS from ImageNet EfficientNet-Lite0 on a GPU: 224 px, 30 rounds, seed 0, target sketch,
# FedAvg and FedGA (bf16 autocast and channels_last by default on CUDA). Needs the extra
# `pretrained`; reads $FEDSHIFT_REAL_DATA/PACS. Usage: run.sh [OUT]
set -euo pipefail
data="${FEDSHIFT_REAL_DATA:?set FEDSHIFT_REAL_DATA to the folder holding PACS/}"
out="${1:-runs/pacs-gpu}"
for algo in fedavg fedga; do
  fedshift run -a "$algo" -d pacs -t sketch --device cuda --set data_root="$data/PACS" \
    --model efficientnet-lite0 --set model_weights=imagenet --set image_size=224 --rounds 30 \
    --out "$out/$algo-sketch-s0" --quiet
done
fedshift report "$out" --metric target_accuracy
fedshift report "$out" --metric target_accuracy_last
