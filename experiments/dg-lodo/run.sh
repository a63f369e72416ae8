#!/usr/bin/env bash
# Domain-generalization methods on digits-dg, leave-one-domain-out, 3 seeds x 4 targets,
# 30 rounds (the table ran on one H100: DEVICE=cuda), then the CPU table (targets mnistm and
# optdigits) and FedGA's and FedADG's official-code forms (target mnistm) on the CPU.
# Usage: [DEVICE=cuda] run.sh [OUT]
set -euo pipefail
out="${1:-runs/dg-lodo}"
tables="$(dirname "$0")/../../benchmarks/results/method_tables.sh"
rows=fedavg,ccst,feddg-elcfs,fedga,fedadg,ditto,fedsr,local
DEVICE="${DEVICE:-auto}" TARGETS=mnist,mnistm,optdigits,syn bash "$tables" "$out/gpu" lodo
DEVICE=cpu TARGETS=mnistm,optdigits bash "$tables" "$out/cpu" lodo
DEVICE=cpu TARGETS=mnistm bash "$tables" "$out/cpu" lodo-official
for metric in target_accuracy target_accuracy_last; do
  fedshift report "$out/gpu/lodo" --rows "$rows" --metric "$metric"
  fedshift report "$out/cpu/lodo" --rows "$rows" --metric "$metric"
done
