#!/usr/bin/env bash
# Baselines on digits-dg, leave-one-domain-out: FedAvg, centralized and local, each domain the
# target in turn, 30 rounds, seed 0, one CPU thread. Usage: run.sh [OUT]
set -euo pipefail
out="${1:-runs/issue2}"
fedshift sweep -a fedavg,centralized,local -t mnist,mnistm,optdigits,syn --seeds 0 --rounds 30 \
  --set threads=1 --out "$out" --quiet
fedshift report "$out" --rows fedavg,centralized,local
fedshift report "$out" --rows fedavg,centralized,local --metric target_accuracy_last
