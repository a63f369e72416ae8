"""The ``fedshift`` command line."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from fedshift.core.errors import (
    CheckpointError,
    ConfigError,
    DatasetError,
    RoundFailed,
    RunInterrupted,
    StorageError,
    did_you_mean,
)
from fedshift.core.runconfig import DEVICES, PARTITIONS, PROTOCOLS, RunConfig
from fedshift.core.version import __version__

EXIT_USAGE = 2
#: exit status after Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130
#: errors a command reports as one line ``fedshift: error: ...`` and exit code 2
USER_ERRORS = (ConfigError, CheckpointError, DatasetError, RoundFailed, OSError)


def fail(message: object) -> int:
    """Report an error as one line on stderr; the exit code of a usage error."""
    text = " ".join(str(message).split())
    print(f"fedshift: error: {text}", file=sys.stderr)
    return EXIT_USAGE


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports errors as one line and exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        print(f"fedshift: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="fedshift",
        description="Federated learning under domain shift. With no arguments, `fedshift run` "
        "trains FedAvg on the embedded digits-dg benchmark, target mnistm.",
    )
    parser.add_argument("--version", action="version", version=f"fedshift {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=ArgumentParser)

    run = sub.add_parser("run", help="run one experiment")
    defaults = RunConfig()
    run.add_argument(
        "-a",
        "--algorithm",
        help=f"algorithm (default {defaults.algorithm}; see `fedshift list algorithms`), "
        "or a plug-in as package.module:Class",
    )
    run.add_argument(
        "-d",
        "--dataset",
        help=f"dataset name or folder path (default {defaults.dataset}; "
        "see `fedshift datasets list`). A catalog dataset reads your copy "
        "(--set data_root=PATH) with its official split (--set split_files=DIR for your own "
        "lists) at its resolution: 224 px for the photo sets (pacs, office-home, vlcs, "
        "terra-incognita, domainnet, domainnet10, office-caltech10, office31), 32 px for "
        "digit-five, cifar10, cifar100, 384 px for fundus, prostate; a folder path is resized "
        "to 64 px; digits-dg is 32 px; --set image_size=N overrides",
    )
    run.add_argument("-t", "--target", help=f"held-out target domain (default {defaults.target})")
    run.add_argument("-s", "--sources", help="comma-separated source domains (default: all others)")
    run.add_argument(
        "--protocol",
        help=f"evaluation protocol: {', '.join(PROTOCOLS)} (default {defaults.protocol})",
    )
    run.add_argument("--rounds", type=int, help=f"rounds (default {defaults.rounds})")
    run.add_argument(
        "--local-epochs",
        type=int,
        dest="local_epochs",
        help=f"local epochs per round (default {defaults.local_epochs})",
    )
    run.add_argument(
        "--clients-per-domain",
        type=int,
        dest="clients_per_domain",
        help=f"clients each domain is split into (default {defaults.clients_per_domain})",
    )
    run.add_argument(
        "--partition",
        help=f"how the source data is split among clients: {', '.join(PARTITIONS)} "
        "(iid, dirichlet, nway-kshot: each domain on its own; heterogeneity: across the "
        f"source domains, --set lambda=L) (default {defaults.partition})",
    )
    run.add_argument(
        "--model",
        help=f"backbone (default: the algorithm's, else {defaults.model}; see `fedshift list "
        "models`), or a plug-in as package.module:builder",
    )
    run.add_argument("--seed", type=int, help=f"seed (default {defaults.seed})")
    run.add_argument("--device", help=f"{', '.join(DEVICES)} (default {defaults.device})")
    run.add_argument("--out", help="run directory (default runs/<algo>-<dataset>-<target>-s<seed>)")
    run.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its checkpoint"
    )
    run.add_argument("--config", help="TOML file with run keys and an [algo] table")
    run.add_argument(
        "--preset",
        help="start from a paper preset (see `fedshift list presets`) or a preset TOML file; "
        "--config, flags and --set override its settings",
    )
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set lr=0.05 --set algo.mu=0.1",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--dry-run",
        action="store_true",
        dest="dry_run",
        help="print the resolved config and the clients (role, domain, split sizes); no training",
    )

    sw = sub.add_parser(
        "sweep", help="algorithms x targets x seeds x a hyperparameter grid (resumable, parallel)"
    )
    sw.add_argument("-a", "--algorithms", required=True, help="comma-separated algorithms")
    sw.add_argument("-t", "--targets", required=True, help="comma-separated target domains")
    sw.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    sw.add_argument("-d", "--dataset")
    sw.add_argument("--protocol")
    sw.add_argument("--rounds", type=int)
    sw.add_argument("--model", help="model of every run (as fedshift run --model)")
    sw.add_argument("--out", required=True, help="folder for the run directories")
    sw.add_argument("--config", help="TOML file applied to every run")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    sw.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="sweep a run key or algo.<hyperparameter> over values, crossed with the others, "
        "e.g. --grid algo.mu=0.001,0.01 --grid lr=0.01,0.05 "
        "(run directories ALGO-TARGET-sSEED@KEY=V,...)",
    )
    sw.add_argument(
        "--jobs",
        type=int,
        help="runs at once (default 1; with --backend ray: all, as Ray schedules them); "
        "each gets max(1, cores // jobs) CPU threads unless threads is set",
    )
    sw.add_argument(
        "--devices", help="comma-separated devices given to runs round-robin, e.g. cuda:0,cuda:1"
    )
    sw.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: this process (jobs 1) or spawned worker processes; ray: one Ray task per "
        "run (pip install 'fedshift[ray]'; joins $RAY_ADDRESS when set)",
    )
    sw.add_argument("--quiet", action="store_true")

    rep = sub.add_parser("report", help="tables (mean ± std over seeds) from run directories")
    rep.add_argument("paths", nargs="+", help="run directories or folders holding them")
    rep.add_argument(
        "--metric",
        default="target_accuracy",
        help="summary key to tabulate (default target_accuracy, source-val selected)",
    )
    rep.add_argument("--rows", help="comma-separated algorithm order")
    rep.add_argument("--format", choices=["md", "csv"], default="md")
    rep.add_argument(
        "--plot",
        help="also write per-round curves of --metric (mean ± std over seeds) to this PNG; "
        "a summary figure such as target_accuracy_last draws its per-round metric",
    )

    lst = sub.add_parser(
        "list", help="list algorithms, datasets, models (plug-ins marked) or paper presets"
    )
    lst.add_argument("what", choices=["algorithms", "datasets", "models", "presets"])

    show_algo = sub.add_parser(
        "show", help="an algorithm's hyperparameters, what it shares and its protocols"
    )
    show_algo.add_argument("algorithm", help="an algorithm name (see `fedshift list algorithms`)")

    ds = sub.add_parser("datasets", help="inspect datasets")
    ds_sub = ds.add_subparsers(dest="action", parser_class=ArgumentParser, required=True)
    show = ds_sub.add_parser("show", help="write a grid of samples per domain")
    show.add_argument("name", nargs="?", default="digits-dg")
    show.add_argument("--out", default="digits-grid.png")
    show.add_argument("--per-domain", type=int, default=10, dest="per_domain")
    ds_sub.add_parser(
        "list", help="the dataset catalog: source, domains, classes, layout, split, resolution"
    )
    check = ds_sub.add_parser("check", help="validate a copy; per-domain, per-split counts")
    check.add_argument("name", help="a catalog name (see `fedshift datasets list`)")
    check.add_argument("--root", required=True, help="where the dataset lies")

    plot = sub.add_parser("plot", help="figures from run directories")
    plot_sub = plot.add_subparsers(dest="figure", parser_class=ArgumentParser, required=True)
    tsne = plot_sub.add_parser(
        "tsne", help="t-SNE of client features, coloured by class, global prototypes marked"
    )
    tsne.add_argument("run_dir", help="a run directory (config.json + checkpoint.pt)")
    tsne.add_argument("--out", help="PNG file (default RUN_DIR/tsne.png)")
    tsne.add_argument("--per-client", type=int, default=100, dest="per_client")
    tsne.add_argument(
        "--with-target",
        action="store_true",
        dest="with_target",
        help="also embed the held-out target domain's test split (its own marker)",
    )
    curves = plot_sub.add_parser(
        "curves", help="per-round curves, one line per config with mean ± std over seeds"
    )
    curves.add_argument("run_dirs", nargs="+", help="run directories or folders holding them")
    curves.add_argument("--out", required=True, help="PNG file to write")
    curves.add_argument(
        "--metric",
        default="target_accuracy",
        help="a metrics.jsonl key, e.g. train_loss or per_domain_accuracy/mnist "
        "(default target_accuracy)",
    )

    pre = sub.add_parser(
        "pretrain", help="pretrain a backbone on one public domain (PerAda's frozen backbone)"
    )
    pre.add_argument("--domain", required=True, help="the domain to train on (then leave it out)")
    pre.add_argument("--out", required=True, help="weights file to write (+ OUT.json sidecar)")
    pre.add_argument("-d", "--dataset", default="digits-dg")
    pre.add_argument("--model", default="cnn")
    pre.add_argument("--epochs", type=int, default=5)
    pre.add_argument("--lr", type=float, default=0.01)
    pre.add_argument("--batch-size", type=int, default=64, dest="batch_size")
    pre.add_argument("--seed", type=int, default=0)
    pre.add_argument("--device", default="auto", help="auto, cpu or cuda")
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from fedshift.config import resolve, resolve_resume
    from fedshift.engine.rundir import check_run_dir
    from fedshift.engine.runner import run_experiment
    from fedshift.report.table import format_summary

    flags = {
        "algorithm": args.algorithm,
        "dataset": args.dataset,
        "target": args.target,
        "sources": args.sources,
        "protocol": args.protocol,
        "rounds": args.rounds,
        "local_epochs": args.local_epochs,
        "clients_per_domain": args.clients_per_domain,
        "partition": args.partition,
        "model": args.model,
        "seed": args.seed,
        "device": args.device,
        "preset": args.preset,
    }
    if args.sources is not None and not _csv(args.sources):
        return fail(
            f"--sources {args.sources!r} names no domain; give comma-separated source domains "
            "or leave --sources out for every domain but the target"
        )
    try:
        if args.resume and args.out:
            check_run_dir(Path(args.out), resume=True)  # before its config.json is read
            cfg = resolve_resume(args.out, args.config, flags, args.set)
        else:
            cfg = resolve(args.config, flags, args.set)
        if args.dry_run:
            return print_task(cfg)
        summary, out_dir = run_experiment(
            cfg, args.out, resume=args.resume, progress=not args.quiet
        )
    except RunInterrupted as stop:
        how = "continue it with" if stop.checkpointed else "nothing was saved; start it again with"
        print(
            f"fedshift: interrupted; {how}: fedshift run --out {stop.run_dir} --resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except StorageError as exc:
        from fedshift.core.state import has_checkpoint

        then = (
            f"continue with: fedshift run --out {exc.path.parent} --resume"
            if has_checkpoint(exc.path.parent)
            else "run the same command again"
        )
        return fail(f"{exc}; free some space (or fix the folder), then {then}")
    except USER_ERRORS as exc:
        return fail(exc)
    print(format_summary(summary))
    print(f"run directory: {out_dir}")
    return 0


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedshift.engine.sweep import sweep
    from fedshift.report.aggregate import markdown, table
    from fedshift.report.selection import has_grid, selection_markdown

    try:
        seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        print(f"fedshift: error: --seeds expects integers, got {args.seeds!r}", file=sys.stderr)
        return EXIT_USAGE
    flags = {
        "dataset": args.dataset,
        "protocol": args.protocol,
        "rounds": args.rounds,
        "model": args.model,
    }
    algorithms = _csv(args.algorithms)
    try:
        summaries = sweep(
            algorithms,
            _csv(args.targets),
            seeds,
            args.out,
            config_file=args.config,
            flags=flags,
            sets=args.set,
            grid=args.grid,
            jobs=args.jobs,
            devices=_csv(args.devices) if args.devices else None,
            backend=args.backend,
            progress=not args.quiet,
        )
    except RunInterrupted as stop:
        print(
            f"fedshift: interrupted in {stop.run_dir}; run the same sweep again to continue it",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except USER_ERRORS as exc:
        return fail(exc)
    if summaries:
        if has_grid(summaries):
            print(selection_markdown(summaries, rows=algorithms))
        else:
            print(markdown(*table(summaries, rows=algorithms)))
    if summaries.failed:
        print(
            f"fedshift: {len(summaries.failed)} of {len(summaries) + len(summaries.failed)} "
            f"runs failed: {', '.join(path.name for path, _ in summaries.failed)}; fix the "
            "cause and run the same sweep again (finished runs are kept)",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedshift.report.aggregate import csv_text, find_summaries, markdown, table
    from fedshift.report.curves import plot_curves
    from fedshift.report.selection import has_grid, points_table, selection_markdown

    if args.plot and not Path(args.plot).resolve().parent.is_dir():
        return fail(f"--plot {args.plot}: folder {Path(args.plot).parent} does not exist")
    try:
        summaries = find_summaries(args.paths)
    except FileNotFoundError as exc:
        return fail(exc)
    if not summaries:
        return fail(f"no summary.json under {', '.join(args.paths)}")
    metrics = sorted(
        {k for s in summaries for k, v in s.items() if isinstance(v, int | float)}
        - {"seed", "rounds"}
    )
    if args.metric not in metrics:
        from fedshift.core.errors import did_you_mean

        return fail(
            f"unknown --metric {args.metric!r}{did_you_mean(args.metric, metrics)}; "
            f"the summaries have: {', '.join(metrics)}"
        )
    rows = _csv(args.rows) if args.rows else None
    if has_grid(summaries):  # a grid sweep: per grid point, then the selected ones
        if args.format == "md":
            print(selection_markdown(summaries, args.metric, rows))
        else:
            print(csv_text(*points_table(summaries, args.metric, rows)))
    else:
        header, body = table(summaries, args.metric, rows)
        print(markdown(header, body) if args.format == "md" else csv_text(header, body))
    if args.plot:
        try:
            path = plot_curves([s["_run_dir"] for s in summaries], args.plot, args.metric)
        except USER_ERRORS as exc:
            return fail(exc)
        print(f"wrote {path}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    if args.what == "algorithms":
        from fedshift.algorithms import all_algorithms, origin_of

        rows = [("name", "shares", "paper", "from")]
        for name, cls in all_algorithms().items():
            shares = ", ".join(f"{k}:{v.value}" for k, v in cls.shares.items()) or "nothing"
            if cls.pooled:
                shares = "nothing (pooled data, not federated)"
            rows.append((name, shares, cls.paper, origin_of(name)))
    elif args.what == "presets":
        from fedshift.presets import load_preset, preset_names

        rows = [("name", "algorithm", "dataset", "paper", "paper's number")]
        for name in preset_names():
            preset = load_preset(name)
            meta = preset.meta
            paper, result = meta.get("paper", "-"), meta.get("paper_result", "-")
            rows.append((name, preset.algorithm, preset.dataset, paper, result))
    elif args.what == "models":
        from fedshift.models.registry import all_models

        rows = [("name", "description", "from")]
        rows += [(name, desc, origin) for name, (desc, origin) in all_models().items()]
    else:
        from fedshift.data import describe_datasets
        from fedshift.data.custom import custom_datasets

        rows = [("name", "domains (train/val/test)", "classes")]
        for info in describe_datasets():
            domains = ", ".join(
                f"{d} ({s['train']}/{s['val']}/{s['test']})" for d, s in info["domains"].items()
            )
            rows.append((info["name"], domains, str(info["classes"])))
        rows += [(name, f"({origin})", "-") for name, origin in custom_datasets().items()]
        rows.append(("PATH", "any folder laid out ROOT/<domain>/<class>/<image>", "-"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def print_task(cfg) -> int:
    """``run --dry-run``: the resolved config (as a TOML file ``--config`` reads) and the
    federated task, built as for a run but not trained."""
    import json

    from fedshift.engine.assembly import prepare

    info = prepare(cfg).info
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
    rows = [("id", "name", "domain", "role", "train", "val", "test")]
    rows += [
        tuple(str(c[k]) for k in ("id", "name", "domain", "role", "train", "val", "test"))
        for c in info["clients"]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def hparam_docs(hparams: type) -> dict[str, str]:
    """Each hyperparameter's help: its field metadata (``symbol``, ``help``), else the
    comment lines just above the field in the source (where the paper's symbol is given)."""
    import dataclasses
    import inspect

    try:
        lines = inspect.getsource(hparams).splitlines()
    except (OSError, TypeError):
        lines = []
    docs = {}
    for item in dataclasses.fields(hparams):
        meta = " ".join(str(item.metadata[k]) for k in ("symbol", "help") if k in item.metadata)
        if not meta:
            at = next(
                (i for i, line in enumerate(lines) if re.match(rf"\s+{item.name}\s*:", line)), None
            )
            comments: list[str] = []
            while at is not None and at > 0 and lines[at - 1].strip().startswith("#"):
                at -= 1
                comments.insert(0, lines[at].strip().lstrip("#").strip())
            meta = " ".join(comments)
        docs[item.name] = meta
    return docs


def cmd_show(args: argparse.Namespace) -> int:
    import dataclasses
    import inspect

    from fedshift.algorithms import get_algorithm, origin_of
    from fedshift.core.hparams import hparam_types

    try:
        cls = get_algorithm(args.algorithm)
    except ConfigError as exc:
        return fail(exc)
    doc = inspect.getdoc(cls) or ""
    print(f"{args.algorithm}: {cls.paper or '(no paper given)'} [{origin_of(args.algorithm)}]")
    if doc:
        print("\n" + doc.split("\n\n")[0] + "\n")
    shares = ", ".join(f"{k} ({v.value})" for k, v in cls.shares.items()) or "nothing"
    if cls.pooled:
        shares = "nothing (pooled data, not federated)"
    print(f"shares:     {shares}")
    print(f"protocols:  {', '.join(cls.protocols or PROTOCOLS)}")
    print(f"problems:   {', '.join(cls.supported_problems())}")
    print(f"model:      {cls.default_model or RunConfig().model} (default)")
    fields = dataclasses.fields(cls.Hparams)
    if not fields:
        print("hyperparameters: none")
        return 0
    print("hyperparameters (--set algo.NAME=VALUE):")
    types_ = hparam_types(cls.Hparams)
    docs = hparam_docs(cls.Hparams)
    rows = [("name", "type", "default", "meaning")]
    for item in fields:
        kind = types_[item.name]
        kind_text = getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
        default = item.default if item.default is not dataclasses.MISSING else "(required)"
        rows.append((f"algo.{item.name}", kind_text, repr(default), docs[item.name]))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        head = "  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True))
        print(f"  {head}  {row[3]}".rstrip())
    return 0


def print_catalog() -> None:
    """The catalog entries, then the built-in digits-dg and the generic folder fallback."""
    from fedshift.data import digits
    from fedshift.data.catalog import CATALOG
    from fedshift.data.registry import CATALOG_LOADERS

    for entry in CATALOG.values():
        runs = (
            f"fedshift run -d {entry.name} --set data_root=PATH"
            if entry.name in CATALOG_LOADERS
            else "not yet (datasets check only)"
        )
        print(f"{entry.name}  [{entry.resolution} px]  {entry.source}")
        print(f"    domains: {', '.join(entry.domains)}")
        print(f"    classes: {', '.join(entry.classes) or 'the class folders found, sorted'}")
        print(f"    layout:  {entry.layout}")
        print(f"    split:   {entry.split}")
        print(f"    runs:    {runs}")
    print(f"{digits.NAME}  [{digits.IMAGE_SIZE} px]  built in, generated offline")
    print(f"    domains: {', '.join(digits.DOMAINS)}")
    print("    classes: 0..9")
    print("    split:   fixed train/val/test per domain")
    print(f"    runs:    fedshift run -d {digits.NAME}")
    print("folder  [64 px]  any ROOT/<domain>/<class>/<image> tree (generic fallback)")
    print("    domains: the domain folders; classes: the class folders found, sorted")
    print("    split:   seeded stratified 70/10/20 per domain (--set split_seed=N)")
    print("    runs:    fedshift run -d PATH (or folder:PATH); --set image_size=N to resize")


def cmd_datasets(args: argparse.Namespace) -> int:
    from fedshift.data import load_dataset
    from fedshift.data.catalog import check_dataset
    from fedshift.data.preview import save_sample_grid

    if args.action == "list":
        print_catalog()
        return 0
    if args.action == "check":
        try:
            counts, warnings = check_dataset(args.name, args.root)
        except USER_ERRORS as exc:
            return fail(exc)
        for domain, splits in counts.items():
            print(f"{domain}: " + ", ".join(f"{s} {n}" for s, n in splits.items()))
        for warning in warnings:
            print(f"fedshift: warning: {warning}", file=sys.stderr)
        return 0
    try:
        dataset = load_dataset(args.name)
        path = save_sample_grid(dataset, Path(args.out), per_domain=args.per_domain)
    except USER_ERRORS as exc:
        return fail(exc)
    print(f"wrote {path}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    if args.figure == "curves":
        from fedshift.report.curves import find_run_dirs, plot_curves

        if not Path(args.out).resolve().parent.is_dir():
            return fail(f"--out {args.out}: folder {Path(args.out).parent} does not exist")
        try:
            path = plot_curves(find_run_dirs(args.run_dirs), args.out, args.metric)
        except USER_ERRORS as exc:
            return fail(exc)
        print(f"wrote {path}")
        return 0
    from fedshift.report.tsne import plot_tsne

    try:
        path = plot_tsne(
            args.run_dir, args.out, per_client=args.per_client, with_target=args.with_target
        )
    except USER_ERRORS as exc:
        return fail(exc)
    print(f"wrote {path}")
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from fedshift.data import load_dataset
    from fedshift.engine.assembly import resolve_device
    from fedshift.pretrain import pretrain

    try:
        dataset = load_dataset(args.dataset)
        meta = pretrain(
            dataset,
            args.domain,
            args.out,
            model=args.model,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            seed=args.seed,
            device=resolve_device(args.device),
        )
    except (*USER_ERRORS, ValueError) as exc:
        return fail(exc)
    print(
        f"wrote {args.out} ({meta['model']} pretrained on {meta['dataset']}/{meta['domain']}, "
        f"validation accuracy {meta['val_accuracy']:.3f}); use it with "
        f"--set algo.backbone={args.out} and keep {meta['domain']!r} out of the run"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv or ["run"])
    if args.command is None:
        args = parser.parse_args(["run", *argv])
    handlers = {
        "run": cmd_run,
        "sweep": cmd_sweep,
        "report": cmd_report,
        "list": cmd_list,
        "show": cmd_show,
        "datasets": cmd_datasets,
        "plot": cmd_plot,
        "pretrain": cmd_pretrain,
    }
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("fedshift: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
