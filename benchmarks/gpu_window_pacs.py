"""One line for the GPU window's table: how far the PACS run got, its accuracy and time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

run = Path(sys.argv[1])
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
config = json.loads((run / "config.json").read_text())
start = f"{config['model_weights']} weights" if config.get("model_weights") else "scratch"
last = rows[-1]
seconds = sum(float(row.get("seconds", 0.0)) for row in rows)
print(
    f"PACS -> sketch, FedAvg, {config['model']} from {start} at {config['image_size']} px: "
    f"{len(rows)} rounds in {seconds:.0f} s, target accuracy "
    f"{last.get('target_accuracy', float('nan')):.3f} at round {last['round']}"
)
