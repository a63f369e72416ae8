"""Sweep FedAvg and a FedProx mu grid over targets and seeds from Python, then choose mu by
source validation (DomainBed's training-domain validation) and tabulate mean ± std over seeds.

    python examples/sweep_and_report.py [--smoke] [--jobs N]

A sweep is resumable: run it again and finished runs are read back, not repeated. The
same tables come from `fedshift report OUT`; the same sweep from the command line is
`fedshift sweep -a fedavg,fedprox -t mnistm --grid algo.mu=0.001,0.01,0.1 --out OUT`.
"""

import argparse
import tempfile

import fedshift
from fedshift.report.selection import selection_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny settings (seconds, for CI)")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temp folder)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (worker processes)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="fedshift-sweep-")
    if args.smoke:
        plan = {"targets": ["mnistm"], "seeds": [0], "rounds": 1, "client_data_fraction": 0.1}
        mus = [0.01, 0.1]
    else:
        plan = {"targets": ["mnistm", "syn"], "seeds": [0, 1, 2], "rounds": 10}
        mus = [0.001, 0.01, 0.1]

    # algo.mu applies to FedProx only: FedAvg runs once per target and seed
    results = fedshift.sweep(
        out,
        algorithms=["fedavg", "fedprox"],
        grid={"algo.mu": mus},
        jobs=args.jobs,
        device="cpu",
        threads=1,
        **plan,
    )
    for result in results:
        curve = ", ".join(f"{a:.2f}" for a in result.metric("target_accuracy"))
        print(f"{result.run_dir.name}: target accuracy per round {curve}")
    print(selection_markdown([r.summary for r in results], rows=["fedavg", "fedprox"]))
    print(f"runs in {out}; the same tables: fedshift report {out}")


if __name__ == "__main__":  # --jobs > 1 starts fresh interpreters that import this file
    main()
