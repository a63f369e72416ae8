"""One line for the GPU window's table: how far the PACS run got, its accuracy and time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

rows = [json.loads(line) for line in (Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines()]
last = rows[-1]
seconds = sum(float(row.get("seconds", 0.0)) for row in rows)
print(
    f"PACS -> sketch, FedAvg from scratch: {len(rows)} rounds in {seconds:.0f} s, "
    f"target accuracy {last.get('target_accuracy', float('nan')):.3f} at round {last['round']}"
)
