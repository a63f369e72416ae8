#!/usr/bin/env bash
# FedDG-ELCFS vs FedAvg on digit-foreground segmentation (Dice), 4 targets x 3 seeds, 10 rounds,
# then the 30-round check on target mnistm, seed 0. Usage: run.sh [OUT_ROOT]
set -euo pipefail
root="${1:-runs/tables}"
SEG_ROUNDS=10 TARGETS=mnist,mnistm,optdigits,syn \
  bash "$(dirname "$0")/../../benchmarks/results/method_tables.sh" "$root" segmentation
fedshift report "$root/segmentation" --metric target_dice
fedshift sweep -a feddg-elcfs,fedavg -t mnistm --seeds 0 --rounds 30 --set problem=segmentation \
  --set model=unet --set threads=1 --out "$root/segmentation-30" --quiet
fedshift report "$root/segmentation-30" --metric target_dice
