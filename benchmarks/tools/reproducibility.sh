#!/usr/bin/env bash
# Kill a run with SIGKILL after round K, resume it, and compare its summary with an
# uninterrupted run of the same command (and with a second uninterrupted run, if given).
#   bash benchmarks/tools/reproducibility.sh OUT_DIR [ALGO] [TARGET] [ROUNDS] [KILL_AFTER] [REFERENCE_RUN_DIR]
# Extra run options go in $EXTRA, e.g. EXTRA="--set threads=1".
set -euo pipefail
out=${1:?output folder}; algo=${2:-fedavg}; target=${3:-mnistm}; rounds=${4:-30}; kill_after=${5:-10}
ref=${6:-}
mkdir -p "$out"
run="$out/killed"
rm -rf "$run"
fedshift run -a "$algo" -d digits-dg -t "$target" --rounds "$rounds" --seed 0 --quiet --out "$run" ${EXTRA:-} &
pid=$!
until [ -f "$run/metrics.jsonl" ] && [ "$(wc -l < "$run/metrics.jsonl")" -ge "$kill_after" ]; do sleep 0.5; done
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
echo "killed after round $(wc -l < "$run/metrics.jsonl") (checkpoint round $(python -c "
import torch; print(torch.load('$run/checkpoint.pt', weights_only=True)['round'])"))"
fedshift run -a "$algo" -d digits-dg -t "$target" --rounds "$rounds" --seed 0 --quiet --out "$run" --resume ${EXTRA:-} > /dev/null
if [ -z "$ref" ]; then
  ref="$out/uninterrupted"; rm -rf "$ref"
  fedshift run -a "$algo" -d digits-dg -t "$target" --rounds "$rounds" --seed 0 --quiet --out "$ref" ${EXTRA:-} > /dev/null
fi
python - "$run/summary.json" "$ref/summary.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
keys = ["target_accuracy", "target_accuracy_last", "target_accuracy_oracle", "source_val_accuracy",
        "per_domain_accuracy", "selected_round", "bytes_up", "bytes_down"]
for k in keys:
    print(f"{k:24s} resumed={a[k]!s:60.60s} reference={b[k]!s:.60s} {'OK' if a[k] == b[k] else 'DIFFERENT'}")
sys.exit(0 if all(a[k] == b[k] for k in keys) else 1)
PY
