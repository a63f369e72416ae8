"""Run an experiment from Python, read its per-round history, and see a config error.

python examples/run_python_api.py            # 10 rounds of FedProx, target mnistm
python examples/run_python_api.py --smoke    # 1 round on 10 % of the data (CI)
"""

import argparse
import tempfile

import fedshift
from fedshift.core.errors import ConfigError

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="tiny settings (seconds, for CI)")
parser.add_argument("--out", default=None, help="folder for the run (default: a new temp folder)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fedshift-example-")
size = {"rounds": 1, "client_data_fraction": 0.1, "threads": 1} if args.smoke else {"rounds": 10}

# the same keys as `fedshift run --set KEY=VALUE`; hyperparameters go in algo={...}
keys = {"algorithm": "fedprox", "target": "mnistm", "device": "cpu", "algo": {"mu": 0.01}, **size}

task = fedshift.plan(**keys)  # what `fedshift run --dry-run` prints: nothing is trained
print(f"{len(task.clients)} clients on {', '.join(task.sources)}; target {task.targets[0]}")

result = fedshift.run(out=f"{out}/fedprox", **keys)
for row in result.history:
    print(f"round {row['round']}: target accuracy {row['target_accuracy']:.3f}")
print(f"selected by source validation: {result.summary['target_accuracy']:.3f}")
print(f"run directory: {result.run_dir}")

# a finished run reads back the same way
assert fedshift.load_run(result.run_dir).summary == result.summary

# a bad key is the CLI's error, as an exception
try:
    fedshift.run(learning_rate=0.1)
except ConfigError as error:
    print(f"ConfigError: {str(error)[:60]}...")
