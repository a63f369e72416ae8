#!/usr/bin/env bash
# The first real-data table: PACS leave-one-domain-out on the CPU, every method from scratch
# (no ImageNet weights can be had here), at a setting a 2-core CPU affords: 32 px images, the
# run's default CNN, 10 rounds, seed 0, source-validation selection, DomainBed's augmentation
# (PIL backend on the CPU). Two runs at once, one thread each; resumable (run it again to
# continue an interrupted table).
#   bash benchmarks/pacs_cpu_table.sh PACS_ROOT [OUT]      (PACS_ROOT holds the official kfold)
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
python3 - "$out" <<'EOF'
import collections, json, pathlib, sys

per_round = collections.defaultdict(list)
for metrics in sorted(pathlib.Path(sys.argv[1]).glob("*/metrics.jsonl")):
    algorithm = json.loads((metrics.parent / "config.json").read_text())["algorithm"]
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "cpu_seconds" in row:
            per_round[algorithm].append(row["cpu_seconds"])
print("| method | CPU s per round (mean, min-max) | CPU min per 10-round run | rounds measured |")
print("|---|---|---|---|")
for algorithm, seconds in per_round.items():
    mean = sum(seconds) / len(seconds)
    print(f"| {algorithm} | {mean:.1f} ({min(seconds):.1f}-{max(seconds):.1f}) "
          f"| {mean * 10 / 60:.1f} | {len(seconds)} |")
EOF
