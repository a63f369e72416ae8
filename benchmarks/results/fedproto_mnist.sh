#!/usr/bin/env bash
# FedProto's MNIST table (Tan et al., AAAI 2022, Table 1: n = 3, 4, 5 ways, K = 100 shots,
# 20 clients, 100 rounds), reproduced with the preset fedproto-mnist on a copy holding the
# official MNIST idx files (ROOT/mnist/), one run per ways x seed, then the table beside the
# published numbers. Resumable: a finished run (its summary.json) is not run again.
#   bash benchmarks/results/fedproto_mnist.sh DIGIT_FIVE_ROOT [OUT]      (SEEDS, default 0)
set -euo pipefail
root=${1:?usage: fedproto_mnist.sh DIGIT_FIVE_ROOT [OUT]}
out=${2:-runs/fedproto-mnist}
mkdir -p "$out"
for seed in ${SEEDS:-0}; do
  for ways in 3 4 5; do
    run="$out/n$ways-s$seed"
    [ -f "$run/summary.json" ] && continue
    fedshift run --preset fedproto-mnist --set data_root="$root" --set ways="$ways" \
      --seed "$seed" --set threads=1 --out "$run" --quiet > /dev/null
  done
done
python3 - "$out" <<'PY'
import json, pathlib, statistics, sys

published = {3: (97.13, 0.30), 4: (96.80, 0.41), 5: (96.70, 0.29)}
runs = {}
for summary in sorted(pathlib.Path(sys.argv[1]).glob("n*-s*/summary.json")):
    ways, seed = summary.parent.name[1:].split("-s")
    runs.setdefault(int(ways), []).append(json.loads(summary.read_text()))
print("| n (ways) | published (± over clients) | fedshift: mean ± std over clients | seeds |"
      " CPU min per run |")
print("|---|---|---|---|---|")
for ways, (mean, spread) in published.items():
    done = runs.get(ways, [])
    if not done:
        print(f"| {ways} | {mean:.2f} ± {spread:.2f} | (not run) | 0 | |")
        continue
    cells = [f"{100 * s['personalized_accuracy']:.2f} ± {100 * s['personalized_accuracy_std']:.2f}"
             f" (seed {s['seed']})" for s in done]
    cpu = statistics.mean(s["cpu_seconds"] for s in done) / 60
    print(f"| {ways} | {mean:.2f} ± {spread:.2f} | {'; '.join(cells)} | {len(done)} | {cpu:.1f} |")
PY
