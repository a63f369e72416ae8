"""``fedshift run``: one experiment (or, with ``--dry-run``, its resolved config and clients)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from fedshift.cli.errors import Command, run_again
from fedshift.cli.flags import add_config_arguments, add_run_flags, flag_values
from fedshift.cli.tables import print_table
from fedshift.core import numerics
from fedshift.core.errors import ConfigError, RunInterrupted

#: ``--resume`` alone: continue from the latest checkpoint
LATEST = "latest"
#: ``--resume previous``: roll back to the checkpoint before it first
PREVIOUS = "previous"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_flags(parser)
    parser.add_argument(
        "--out", help="run directory (default runs/<algo>-<dataset>-<target>-s<seed>)"
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const=LATEST,
        choices=(LATEST, PREVIOUS),
        help="continue the run in --out from its checkpoint; `--resume previous` rolls back "
        "to the checkpoint before the latest (a poisoned model) and continues from there",
    )
    parser.add_argument(
        "--force-data",
        action="store_true",
        dest="force_data",
        help="with --resume: continue even though a domain's data changed since the run "
        "started (refused by default: the run would mix two datasets)",
    )
    add_config_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_allow_imports_flag(parser, "the --config file, the preset or the resumed run's config.json")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        dest="dry_run",
        help="print the resolved config and the clients (role, domain, split sizes); no training",
    )


def add_allow_imports_flag(parser: argparse.ArgumentParser, files: str) -> None:
    """``--allow-imports``: the one opt-in that lets ``files`` name code to import."""
    parser.add_argument(
        "--allow-imports",
        action="store_true",
        dest="allow_imports",
        help=f"let {files} name an import path (algorithm/model package.module:name); off by "
        "default, as FEDSHIFT_ALLOW_IMPORTS=1",
    )


def csv(text: str) -> list[str]:
    """The non-empty comma-separated parts of ``text``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def run(args: argparse.Namespace) -> int:
    from fedshift.config import resolve, resolve_resume
    from fedshift.core.runfiles import RunFiles
    from fedshift.engine.run.rundir import check_run_dir
    from fedshift.engine.run.runner import run_experiment
    from fedshift.report.table import format_summary

    if args.sources is not None and not csv(args.sources):
        raise ConfigError(
            f"--sources {args.sources!r} names no domain; give comma-separated source domains "
            "or leave --sources out for every domain but the target"
        )
    flags = flag_values(args)
    if args.resume and args.out:
        check_run_dir(Path(args.out), resume=True)  # before its config.json is read
        cfg = resolve_resume(
            args.out, args.config, flags, args.set, allow_imports=args.allow_imports
        )
    else:
        cfg = resolve(args.config, flags, args.set, allow_imports=args.allow_imports)
    if args.dry_run:
        print_task(cfg)
        return 0
    summary, out_dir = run_experiment(
        cfg,
        args.out,
        resume=args.resume is not None,
        roll_back=args.resume == PREVIOUS,
        progress=not args.quiet,
        force_data=args.force_data,
    )
    print(format_summary(summary))
    info = (RunFiles(out_dir).read_config() or {}).get("run_info", {})
    used = info.get("threads")
    if isinstance(used, int):
        print(f"CPU threads: {used} (the numbers depend on the count; --set threads=N)")
    if isinstance(info.get("numerics"), dict):
        print(numerics.summary_line(info["numerics"]))
    line = preset_paper_line(cfg.preset, summary)
    if line:
        print(line)
    print(f"run directory: {out_dir}")
    return 0


def preset_paper_line(preset: str, summary: dict) -> str | None:
    """The paper's number beside this run's, for a run started from a preset that has one."""
    from fedshift.presets import load_preset, paper_line

    if not preset or not summary:
        return None
    try:
        loaded = load_preset(preset)
    except ConfigError:  # a user's preset file moved or changed during the run
        return None
    if summary.get("algorithm") != loaded.algorithm:  # the paper's number is not this one's
        return None
    return paper_line(loaded.meta, [summary])


def threads(count: int) -> str:
    return f"{count} CPU thread" if count == 1 else f"{count} CPU threads"


def print_task(cfg) -> None:
    """``--dry-run``: the resolved config (as a TOML file ``--config`` reads) and the
    federated task, built as for a run but not trained."""
    from fedshift.engine.assembly import prepare
    from fedshift.engine.simulation.vectorized import vectorize_summary

    exp = prepare(cfg)
    info = exp.info
    settings = cfg.to_dict()
    algo = settings.pop("algo")
    print("# resolved config (usable as --config FILE)")
    for key, value in settings.items():
        print(f"{key} = {json.dumps(value)}")
    print("[algo]")
    for key, value in algo.items():
        print(f"{key} = {json.dumps(value)}")
    print(
        f"\n# task: {len(info['clients'])} clients; sources {', '.join(info['sources'])}; "
        f"targets {', '.join(info['targets'])}"
    )
    per_domain = Counter(client["domain"] for client in info["clients"])
    print("# clients per domain: " + ", ".join(f"{d} {n}" for d, n in per_domain.items()))
    layout = "channels_last" if info["channels_last"] else "contiguous"
    compiled = "compiled (torch.compile)" if info["compile"] else "eager"
    where = f"precision {info['precision']} on {info['device']}, {threads(info['threads'])}"
    print(f"# training: {where}; {layout} models; {compiled}")
    print(f"# {numerics.summary_line(info['numerics'])}")
    clients = vectorize_summary(
        cfg.vectorize, exp.device, exp.precision.name, cfg.compile, exp.algorithm.run.train_cfg
    )
    print(f"# clients: {clients}")
    columns = ("id", "name", "domain", "role", "train", "val", "test")
    print_table([columns, *([client[k] for k in columns] for client in info["clients"])])


def interrupted(args: argparse.Namespace, stop: RunInterrupted) -> str:
    how = "continue it with" if stop.checkpointed else "nothing was saved; start it again with"
    return f"; {how}: fedshift run --out {stop.run_dir} --resume"


def after_write_error(args: argparse.Namespace, run_dir: Path) -> str:
    from fedshift.core.state import has_checkpoint

    if has_checkpoint(run_dir):
        return f"continue with: fedshift run --out {run_dir} --resume"
    return run_again(args, run_dir)


COMMAND = Command("run", "run one experiment", add_arguments, run, interrupted, after_write_error)
