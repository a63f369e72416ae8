#!/usr/bin/env bash
# FedProto's MNIST table (AAAI 2022, Table 1): the preset fedproto-mnist at n = 3, 4, 5 ways,
# seeds 0, 1, 2, 100 rounds, then the paper's own formula on the same models.
# Reads $FEDSHIFT_REAL_DATA/digit-five/mnist (the four official idx files). Usage: run.sh [OUT]
set -euo pipefail
data="${FEDSHIFT_REAL_DATA:?set FEDSHIFT_REAL_DATA to the folder holding digit-five/}"
out="${1:-runs/fedproto}"
bench="$(dirname "$0")/../../benchmarks"
SEEDS="0 1 2" bash "$bench/results/fedproto_mnist.sh" "$data/digit-five" "$out"
python "$bench/fidelity/fedproto_official_eval.py" "$out"/n*-s* | tee "$out/paper-formula.md"
