#!/usr/bin/env bash
# The README's main job: FedAvg on the embedded digits-dg, leave-one-domain-out, target mnistm,
# 30 rounds, seed 0, on the pinned CPU numeric path (the defaults). Usage: run.sh [OUT]
set -euo pipefail
out="${1:-runs/main-job}"
fedshift run --out "$out/fedavg-mnistm-s0"
