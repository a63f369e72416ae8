#!/usr/bin/env bash
# PerAda on a backbone pretrained on syn: held-out targets (with its kd_selection=last ablation
# and FedAvg fine-tuning from the same backbone) and the personalized protocol (with Ditto,
# local, FedAvg and the ablations), 3 seeds, 30 rounds. Usage: [DEVICE=cuda] run.sh [OUT_ROOT]
set -euo pipefail
bash "$(dirname "$0")/../../benchmarks/results/method_tables.sh" "${1:-runs/tables}" perada personalized
