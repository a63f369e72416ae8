#!/usr/bin/env bash
# Wall time per round of the same run on Flower (SuperLink + one SuperNode per client on
# 127.0.0.1, insecure: a local measurement only) and on the in-process simulation engine.
#   bash benchmarks/flower_overhead.sh [ROUNDS] [SETTINGS]
# SETTINGS are space-separated key=value items, as --set of `fedshift run` (Flower: set='...'),
# e.g. bash benchmarks/flower_overhead.sh 3 "threads=1"
# Needs `pip install -e '.[flower]'`. Prints both runs' seconds per round and their ratio.
set -euo pipefail
rounds=${1:-3}; extra=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d); trap 'kill $(cat "$work"/*.pid 2>/dev/null) 2>/dev/null || true' EXIT
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FEDSHIFT_CACHE=${FEDSHIFT_CACHE:-$HOME/.cache/fedshift}
port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/logs" "$work/app"
FLWR_HOME="$work/home-link" flower-superlink --insecure --host 127.0.0.1 --port "$port" \
  --disable-runtime-dependency-installation > "$work/logs/superlink.log" 2>&1 &
echo $! > "$work/superlink.pid"
for i in 0 1 2; do  # lodo on digits-dg: three source clients
  node_port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  FLWR_HOME="$work/home-node$i" flower-supernode --insecure --superlink "127.0.0.1:$port" \
    --port "$node_port" --node-config "partition-id=$i num-partitions=3" \
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
(cd "$work/app" && FLWR_HOME="$work/home-cli" timeout 1800 flwr run . local --stream \
  --run-config "rounds=$rounds device='cpu' out-dir='$work/flower' set='$extra'" \
  > "$work/logs/run.log" 2>&1) || { tail -20 "$work/logs/run.log"; exit 1; }
sets=()
for item in $extra; do sets+=(--set "$item"); done
fedshift run --rounds "$rounds" --device cpu --out "$work/sim" --quiet "${sets[@]}" > /dev/null
python - "$work" <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
def seconds(run):
    return [json.loads(l)["seconds"] for l in (work / run / "metrics.jsonl").read_text().splitlines()]
flower, sim = seconds("flower"), seconds("sim")
accs = [json.loads((work / r / "summary.json").read_text())["target_accuracy"] for r in ("flower", "sim")]
print(f"seconds per round  flower: {flower}  simulation: {sim}")
print(f"mean  flower {sum(flower)/len(flower):.1f} s  simulation {sum(sim)/len(sim):.1f} s  "
      f"ratio {sum(flower)/sum(sim):.2f}x  target accuracy flower {accs[0]:.4f} sim {accs[1]:.4f}")
EOF
