"""Engine overhead: samples/s of a FedAvg round through the simulation engine vs a bare
PyTorch loop over the same clients, data, model and batch size (ratio measured in one run).

    python benchmarks/engine_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fedshift.config import resolve
from fedshift.engine.assembly import prepare
from fedshift.engine.runner import Runner


def bare_loop(exp, rounds: int) -> tuple[int, float]:
    model = exp.algorithm.run.build_model()
    seen, t0 = 0, time.perf_counter()
    for _ in range(rounds):
        for ctx in exp.contexts.values():
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
            model.train()
            for x, y in ctx.train.batches(
                ctx.train_cfg.batch_size, torch.Generator().manual_seed(0)
            ):
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen += len(x)
    return seen, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cfg = resolve(None, {"rounds": args.rounds}, ["device=cpu", "eval_every=1000"])
    exp = prepare(cfg)
    seen, bare = bare_loop(exp, args.rounds)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        runner = Runner(exp, __import__("pathlib").Path(tmp) / "run", progress=False)
        runner.run()
        engine = time.perf_counter() - t0
    print(f"bare PyTorch loop : {seen / bare:8.0f} samples/s ({bare:.1f} s)")
    print(
        f"simulation engine : {runner.fed.samples / engine:8.0f} samples/s ({engine:.1f} s, "
        "incl. aggregation, checkpoints, one final evaluation)"
    )
    print(f"engine / bare     : {(runner.fed.samples / engine) / (seen / bare):.2f}")


if __name__ == "__main__":
    main()
