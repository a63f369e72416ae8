"""One line for the GPU window's table: how far the PACS run got, its accuracy and time.

The accuracy is given at the round that source validation picks (fedshift's own rule, as a
finished run's summary uses it) and at the last evaluated round, so a run stopped at the
step's time limit still reports what it finished.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fedshift.engine.run.selection import LAST, SOURCE_VAL, select

run = Path(sys.argv[1])
metrics = run / "metrics.jsonl"
if not metrics.is_file() or not metrics.read_text().strip():
    print(f"PACS: no round finished in the time given ({metrics} is empty or missing)")
    sys.exit(1)
rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
config = json.loads((run / "config.json").read_text())
start = f"{config['model_weights']} weights" if config.get("model_weights") else "scratch"
last = select(rows, LAST)
best = select(rows, SOURCE_VAL)
seconds = sum(float(row.get("seconds", 0.0)) for row in rows)
print(
    f"PACS -> {config['target']}, {config['algorithm']}, {config['model']} from {start} at "
    f"{config['image_size']} px: "
    f"{len(rows)} rounds in {seconds:.0f} s, target accuracy "
    f"{best.get('target_accuracy', float('nan')):.3f} at round {best['round']} "
    f"(source-validation choice), {last.get('target_accuracy', float('nan')):.3f} at "
    f"round {last['round']} (last)"
)
