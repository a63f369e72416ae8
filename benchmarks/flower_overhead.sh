#!/usr/bin/env bash
# Seconds per round of the same FedAvg run on loopback Flower (a SuperLink and one SuperNode
# per client on 127.0.0.1, insecure: a local measurement only) and on the in-process
# simulation engine, interleaved: REPS x (Flower run, simulation run), one cluster kept up.
#   bash benchmarks/flower_overhead.sh [ROUNDS] [REPS] [SETTINGS]
# SETTINGS are space-separated key=value items, as --set of `fedshift run` (Flower: set='...'),
# e.g. bash benchmarks/flower_overhead.sh 4 2 "threads=1 client_data_fraction=0.1"
# Prints every run's seconds per round, the median of rounds 2.. (round 1 also holds the
# node discovery and the first dataset cache build) for each engine, and their ratio.
# Needs `pip install -e '.[flower]'`. Absolute times on a shared machine are noisy; compare
# the ratio, and only between runs of one invocation.
set -euo pipefail
rounds=${1:-4}; reps=${2:-2}; extra=${3:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
cleanup() {
  for f in "$work"/*.pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true; done
}
trap cleanup EXIT
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FEDSHIFT_CACHE=${FEDSHIFT_CACHE:-$HOME/.cache/fedshift}
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
mkdir -p "$work/logs" "$work/app"
FLWR_HOME="$work/home-link" flower-superlink --insecure --host 127.0.0.1 --port "$port" \
  --disable-runtime-dependency-installation > "$work/logs/superlink.log" 2>&1 &
echo $! > "$work/superlink.pid"
for i in 0 1 2; do  # lodo on digits-dg: three source clients
  FLWR_HOME="$work/home-node$i" flower-supernode --insecure --superlink "127.0.0.1:$port" \
    --port "$(free_port)" --node-config "partition-id=$i num-partitions=3" \
    > "$work/logs/node$i.log" 2>&1 &
  echo $! > "$work/node$i.pid"
done
for _ in $(seq 1 240); do
  [ "$(grep -l 'SuperNode ID' "$work"/logs/node*.log 2>/dev/null | wc -l)" -ge 3 ] && break
  sleep 0.5
done
mkdir -p "$work/home-cli"
printf '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:%s"\ninsecure = true\n' \
  "$port" > "$work/home-cli/config.toml"
cp "$repo/deploy/flower/pyproject.toml" "$work/app/"
sets=()
for item in $extra; do sets+=(--set "$item"); done
for rep in $(seq 1 "$reps"); do
  (cd "$work/app" && FLWR_HOME="$work/home-cli" timeout 1800 flwr run . local --stream \
    --run-config "rounds=$rounds device='cpu' out-dir='$work/flower-$rep' set='$extra'" \
    > "$work/logs/run-$rep.log" 2>&1) || { tail -20 "$work/logs/run-$rep.log"; exit 1; }
  [ -f "$work/flower-$rep/summary.json" ] || { tail -20 "$work/logs/run-$rep.log"; exit 1; }
  fedshift run --rounds "$rounds" --device cpu --out "$work/sim-$rep" --quiet "${sets[@]}" > /dev/null
done
python - "$work" "$reps" <<'EOF'
import json, statistics, sys
from pathlib import Path
work, reps = Path(sys.argv[1]), int(sys.argv[2])
def seconds(run):
    return [json.loads(l)["seconds"] for l in (work / run / "metrics.jsonl").read_text().splitlines()]
later = {"flower": [], "sim": []}
for rep in range(1, reps + 1):
    for engine in later:
        s = seconds(f"{engine}-{rep}")
        later[engine] += s[1:]
        print(f"rep {rep} {engine:6s} seconds per round: {[round(x, 2) for x in s]}")
accs = [json.loads((work / f"{e}-1" / "summary.json").read_text())["target_accuracy"] for e in later]
med = {e: statistics.median(v) for e, v in later.items()}
print(f"median s/round (rounds 2..): flower {med['flower']:.2f}  simulation {med['sim']:.2f}  "
      f"ratio {med['flower'] / med['sim']:.2f}x  (min {min(later['flower']):.2f} / "
      f"{min(later['sim']):.2f})  target accuracy flower {accs[0]:.4f} sim {accs[1]:.4f}")
EOF
