"""Sweep algorithms x targets x seeds from Python, then tabulate mean ± std over seeds.

    python examples/sweep_and_report.py [--smoke]

A sweep is resumable: run it again and finished runs are read back, not repeated. The
same table comes from `fedshift report OUT`.
"""

import argparse
import tempfile

import fedshift
from fedshift.report.aggregate import markdown, table

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="tiny settings (seconds, for CI)")
parser.add_argument("--out", default=None, help="folder for the runs (default: a new temp folder)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fedshift-sweep-")
if args.smoke:
    plan = {"targets": ["mnistm"], "seeds": [0], "rounds": 1, "client_data_fraction": 0.1}
else:
    plan = {"targets": ["mnistm", "syn"], "seeds": [0, 1, 2], "rounds": 10}

results = fedshift.sweep(out, algorithms=["fedavg", "fedprox"], device="cpu", threads=1, **plan)
for result in results:
    curve = ", ".join(f"{a:.2f}" for a in result.metric("target_accuracy"))
    print(f"{result.run_dir.name}: target accuracy per round {curve}")
print(markdown(*table([r.summary for r in results], rows=["fedavg", "fedprox"])))
print(f"runs in {out}; the same table: fedshift report {out}")
