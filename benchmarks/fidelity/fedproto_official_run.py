"""Run FedProto's released code (a checkout of yuetan031/FedProto you provide, unmodified) on
the four official MNIST idx files, with its README's MNIST command, and record what it prints.

    python benchmarks/fidelity/fedproto_official_run.py CHECKOUT DIGIT_FIVE_ROOT OUT \\
        [--ways 3] [--seeds 0,1,2] [--rounds 100] [--python PY]

``DIGIT_FIVE_ROOT/mnist`` holds ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``; they are
decompressed into ``OUT/data/mnist/MNIST/raw`` where torchvision's ``datasets.MNIST`` finds
them without downloading (the code's ``--data_dir`` points there). ``PY`` is an interpreter
with torch, torchvision, numpy and the code's own imports (tensorboardX, tqdm, pandas,
scikit-learn, matplotlib); one torch thread per run. Each seed writes ``OUT/nW-sS.log`` (the
code's whole output) and a line of ``OUT/official.jsonl``: the code's own final figures
("with protos": its reported FedProto accuracy, "w/o protos": the heads), its mean and std over
clients as it prints them (running ratios, see ``fedproto_official.py``), and CPU seconds;
``OUT/official.md`` tabulates every recorded seed and the mean ± std over seeds. ``--logs`` runs
nothing and records ``OUT/nW-sS.log`` files of this same command run by hand.
Nothing of the released code is copied here; it runs as its README says, from its ``exps/``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: the released README's MNIST command (n = 3 there; ways and seed vary)
README_FLAGS = [
    "--mode", "task_heter", "--dataset", "mnist", "--num_classes", "10", "--num_users", "20",
    "--shots", "100", "--stdev", "2", "--train_shots_max", "110", "--ld", "1",
]  # fmt: skip
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")  # fmt: skip
#: GNU time's ``-f "cpu_user=%U cpu_sys=%S wall=%e"`` line, when a hand run was timed with it
GNU_TIME = re.compile(r"cpu_user=(?P<user>[0-9.]+) cpu_sys=(?P<sys>[0-9.]+)")
FINAL = re.compile(
    r"For all users \((with|w/o) protos\), mean of test acc is ([0-9.]+), std of test acc is "
    r"([0-9.]+)"
)


def fail(message: str) -> None:
    """One line on stderr, exit status 2."""
    print(f"fedproto_official_run: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def stage_mnist(digit_five: Path, out: Path) -> Path:
    """The idx files decompressed where ``datasets.MNIST(OUT/data/mnist)`` reads them; returns
    the ``--data_dir`` to pass (the code appends the dataset's name)."""
    raw = out / "data" / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        source = digit_five / "mnist" / f"{name}.gz"
        if not source.is_file():
            fail(f"{source} is missing")
        target = raw / name
        if not target.is_file():
            with gzip.open(source, "rb") as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    return out / "data"


def run_seed(checkout: Path, data_dir: Path, out: Path, python: str, ways: int, seed: int,
             rounds: int) -> dict:  # fmt: skip
    log = out / f"n{ways}-s{seed}.log"
    argv = [python, "federated_main.py", *README_FLAGS, "--ways", str(ways), "--rounds",
            str(rounds), "--seed", str(seed), "--data_dir", f"{data_dir}/"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with log.open("w") as sink:
        done = subprocess.run(argv, cwd=checkout / "exps", stdout=sink, stderr=subprocess.STDOUT,
                              env=env, check=False)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        fail(f"seed {seed} exited {done.returncode}; see {log}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return record(log, ways, seed, rounds, round(cpu, 1), round(time.monotonic() - start, 1))


def record(log: Path, ways: int, seed: int, rounds: int, cpu: float | None,
           wall: float | None) -> dict:  # fmt: skip
    """One seed's row from the code's output in ``log``: its final figures as it prints them."""
    text = log.read_text() if log.is_file() else ""
    found = {kind: (float(mean), float(std)) for kind, mean, std in FINAL.findall(text)}
    if "with" not in found:
        fail(f"{log} holds no final figures (the run did not finish)")
    if cpu is None and (timed := GNU_TIME.search(text)):  # a hand run under /usr/bin/time
        cpu = round(float(timed["user"]) + float(timed["sys"]), 1)
    return {
        "ways": ways,
        "seed": seed,
        "rounds": rounds,
        "with_protos_mean": found["with"][0],
        "with_protos_std": found["with"][1],
        "without_protos_mean": found.get("w/o", (None, None))[0],
        "without_protos_std": found.get("w/o", (None, None))[1],
        "cpu_seconds": cpu,
        "wall_seconds": wall,
    }


def write_table(out: Path) -> None:
    """``OUT/official.md``: every recorded seed (the last record of each) and, per ways with
    several seeds, the mean ± std over seeds of the code's own figure."""
    rows: dict[tuple, dict] = {}
    for line in (out / "official.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[(row["ways"], row["rounds"], row["seed"])] = row
    lines = [
        "| n (ways) | rounds | seed | with protos (its figure: mean ± std over clients) "
        "| w/o protos | CPU s |",
        "|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[float]] = {}
    for (ways, rounds, seed), row in sorted(rows.items()):
        mean, std = 100 * row["with_protos_mean"], 100 * row["with_protos_std"]
        heads = row["without_protos_mean"]
        cpu = row["cpu_seconds"]
        lines.append(
            f"| {ways} | {rounds} | {seed} | {mean:.2f} ± {std:.2f} "
            f"| {'' if heads is None else f'{100 * heads:.2f}'} | {'' if cpu is None else cpu} |"
        )
        groups.setdefault((ways, rounds), []).append(mean)
    for (ways, rounds), means in groups.items():
        if len(means) > 1:
            lines.append(
                f"| **{ways}** | {rounds} | {len(means)} seeds | **{statistics.mean(means):.2f} ± "
                f"{statistics.stdev(means):.2f}** (over seeds) | | |"
            )
    (out / "official.md").write_text("\n".join(lines) + "\n")


def versions(python: str) -> dict:
    probe = "import json, numpy, torch, torchvision; print(json.dumps({'numpy': numpy.__version__, 'torch': torch.__version__, 'torchvision': torchvision.__version__}))"  # noqa: E501
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    found = json.loads(done.stdout) if done.returncode == 0 else {}
    return {**found, "python": platform.python_version(), "machine": platform.machine()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a checkout of yuetan031/FedProto")
    parser.add_argument("digit_five", type=Path, help="the folder holding mnist/*.gz")
    parser.add_argument("out", type=Path)
    parser.add_argument("--ways", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument(
        "--logs",
        action="store_true",
        help="run nothing: record OUT/nW-sS.log of each seed, the output of this same command "
        "run by hand (CPU time from a GNU time line in it, if any)",
    )
    args = parser.parse_args(argv)
    if not (args.checkout / "exps" / "federated_main.py").is_file():
        print(f"fedproto_official_run: error: {args.checkout} is not a FedProto checkout "
              "(no exps/federated_main.py)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        print(f"fedproto_official_run: error: --seeds {args.seeds!r} is not a list of integers",
              file=sys.stderr)  # fmt: skip
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = None if args.logs else stage_mnist(args.digit_five, args.out)
    commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    env = {"official_commit": commit or "unknown", **versions(args.python)}
    with (args.out / "official.jsonl").open("a") as sink:
        for seed in seeds:
            if args.logs:
                log = args.out / f"n{args.ways}-s{seed}.log"
                row = {**record(log, args.ways, seed, args.rounds, None, None), **env}
            else:
                row = {**run_seed(args.checkout, data_dir, args.out, args.python, args.ways, seed,
                                  args.rounds), **env}  # fmt: skip
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            mean, std = 100 * row["with_protos_mean"], 100 * row["with_protos_std"]
            heads = 100 * row["without_protos_mean"]
            print(f"n = {args.ways}, seed {seed}: with protos {mean:.2f} ± {std:.2f}, "
                  f"w/o protos {heads:.2f}, {row['cpu_seconds']} CPU-s")  # fmt: skip
    write_table(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
