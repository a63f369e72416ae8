#!/usr/bin/env bash
# Seconds per round of the same FedAvg run on loopback Flower (a SuperLink and one SuperNode
# per client on 127.0.0.1, insecure: a local measurement only) and on the in-process
# simulation engine, interleaved: REPS x (a Flower run per mode, a simulation run), one
# SuperLink kept up; the SuperNodes are restarted for each mode.
#   bash benchmarks/speed/flower_overhead.sh [ROUNDS] [REPS] [SETTINGS]
# SETTINGS are space-separated key=value items, as --set of `fedshift run` (Flower: set='...'),
# e.g. bash benchmarks/speed/flower_overhead.sh 4 2 "threads=1 client_data_fraction=0.1"
# MODES (environment, default "resident per-message"): which ClientApp modes to run, as the
# SuperNodes' node config `resident-worker=true` (resident) or `=false` (per-message).
# Prints every run's seconds per round, the median of rounds 2.. (round 1 also holds the
# node discovery, the worker start and the first dataset cache build) for each, and the
# ratio of each Flower mode to the simulation.
# Needs `pip install -e '.[flower]'`. Absolute times on a shared machine are noisy; compare
# the ratio, and only between runs of one invocation.
set -euo pipefail
rounds=${1:-4}; reps=${2:-2}; extra=${3:-}
modes=${MODES:-resident per-message}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
stop_nodes() {
  for f in "$work"/node*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f"); rm -f "$f"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}
cleanup() {
  stop_nodes
  [ -f "$work/superlink.pid" ] && kill -TERM "$(cat "$work/superlink.pid")" 2>/dev/null || true
}
trap cleanup EXIT
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FEDSHIFT_CACHE=${FEDSHIFT_CACHE:-$HOME/.cache/fedshift}
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
mkdir -p "$work/logs" "$work/app" "$work/workers"
chmod 700 "$work/workers"
FLWR_HOME="$work/home-link" flower-superlink --insecure --host 127.0.0.1 --port "$port" \
  --disable-runtime-dependency-installation > "$work/logs/superlink.log" 2>&1 &
echo $! > "$work/superlink.pid"
start_nodes() {  # $1: resident-worker value, $2: log suffix
  for i in 0 1 2; do  # lodo on digits-dg: three source clients
    FLWR_HOME="$work/home-node$i" flower-supernode --insecure --superlink "127.0.0.1:$port" \
      --port "$(free_port)" \
      --node-config "partition-id=$i num-partitions=3 resident-worker=$1 worker-dir='$work/workers'" \
      > "$work/logs/node$i-$2.log" 2>&1 &
    echo $! > "$work/node$i.pid"
  done
  for _ in $(seq 1 240); do
    [ "$(grep -l 'SuperNode ID' "$work"/logs/node*-"$2".log 2>/dev/null | wc -l)" -ge 3 ] && return
    sleep 0.5
  done
  echo "SuperNodes did not register; see $work/logs" >&2; exit 1
}
mkdir -p "$work/home-cli"
printf '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:%s"\ninsecure = true\n' \
  "$port" > "$work/home-cli/config.toml"
cp "$repo/deploy/flower/pyproject.toml" "$work/app/"
sets=()
for item in $extra; do sets+=(--set "$item"); done
for rep in $(seq 1 "$reps"); do
  for mode in $modes; do
    case $mode in resident) value=true ;; per-message) value=false ;;
      *) echo "unknown mode $mode (resident, per-message)" >&2; exit 2 ;; esac
    start_nodes "$value" "$mode-$rep"
    (cd "$work/app" && FLWR_HOME="$work/home-cli" timeout 3600 flwr run . local --stream \
      --run-config "rounds=$rounds device='cpu' out-dir='$work/$mode-$rep' set='$extra'" \
      > "$work/logs/run-$mode-$rep.log" 2>&1) || { tail -20 "$work/logs/run-$mode-$rep.log"; exit 1; }
    [ -f "$work/$mode-$rep/summary.json" ] || { tail -20 "$work/logs/run-$mode-$rep.log"; exit 1; }
    stop_nodes
    if grep -h "running the task in the ClientApp" "$work"/logs/node*-"$mode-$rep".log; then
      echo "($mode rep $rep: a node fell back to the per-message path, above)"
    fi
  done
  fedshift run --rounds "$rounds" --device cpu --out "$work/sim-$rep" --quiet "${sets[@]}" > /dev/null
done
python - "$work" "$reps" $modes <<'EOF'
import json, statistics, sys
from pathlib import Path
work, reps, modes = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def seconds(run):
    return [json.loads(l)["seconds"] for l in (work / run / "metrics.jsonl").read_text().splitlines()]
later = {engine: [] for engine in [*modes, "sim"]}
for rep in range(1, reps + 1):
    for engine in later:
        s = seconds(f"{engine}-{rep}")
        later[engine] += s[1:]
        print(f"rep {rep} {engine:11s} seconds per round: {[round(x, 2) for x in s]}")
med = {e: statistics.median(v) for e, v in later.items()}
acc = {e: json.loads((work / f"{e}-1" / "summary.json").read_text())["target_accuracy"] for e in later}
print(f"median s/round (rounds 2..): simulation {med['sim']:.2f} (min {min(later['sim']):.2f}); "
      f"target accuracy {acc['sim']:.4f}")
for e in modes:
    print(f"  flower {e:11s} {med[e]:.2f} (min {min(later[e]):.2f})  ratio {med[e] / med['sim']:.2f}x"
          f"  target accuracy {acc[e]:.4f}")
EOF
