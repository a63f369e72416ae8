"""The Flower ``ServerApp``: the algorithm's server program over a :class:`FlowerFederation`.

It runs :func:`fedshift.engine.run.runner.run_experiment` (setup, rounds, evaluation,
per-round checkpoints, summary) with the Flower federation instead of the in-process one,
so a Flower run writes the same run directory as ``fedshift run``. Setting the run config
key ``resume=true`` with the same ``out-dir`` continues a killed run from its last
completed round; the SuperNodes restore their client states from their own snapshots.
Algorithms with personal models (FedProto, local, Ditto, PerAda) are evaluated on the
SuperNodes, where those models stay.
"""

from __future__ import annotations

import json
import logging
import uuid

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedshift.core.bounded import read_json_bounded
from fedshift.core.errors import CheckpointError
from fedshift.core.runfiles import RunFiles
from fedshift.engine.assembly import Experiment
from fedshift.engine.flower.federation import FlowerFederation
from fedshift.engine.flower.settings import DeployOptions, load_run_dataset, parse_run_config
from fedshift.engine.run.runner import run_experiment

log = logging.getLogger(__name__)

app = ServerApp()


def run_on_grid(grid: Grid, run_config: dict) -> tuple[dict, str]:
    """Run the experiment described by a Flower run config over ``grid``.

    Returns the summary and the run directory (the summary is empty when the run was
    stopped early).
    """
    cfg, opts = parse_run_config(run_config)
    token = run_token(opts)

    def federation(exp: Experiment) -> FlowerFederation:
        exp.info["flower_run_token"] = token
        return FlowerFederation(grid, exp, opts, token)

    summary, out_dir = run_experiment(
        cfg,
        opts.out_dir or None,
        resume=opts.resume,
        force_data=opts.force_data,
        progress=False,
        dataset=load_run_dataset(cfg, opts),
        federation=federation,
    )
    return summary, str(out_dir)


def run_token(opts: DeployOptions) -> str:
    """A new token for a new run; a resumed run reuses the one in its ``config.json``, so
    the SuperNodes find the client states they saved for it."""
    if not opts.resume:
        return uuid.uuid4().hex
    config = RunFiles(opts.out_dir).config
    try:
        return str(read_json_bounded(config, CheckpointError)["run_info"]["flower_run_token"])
    except (CheckpointError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"cannot resume on Flower: {config} does not name the run's Flower token ({exc}); "
            "resume a run that was started on Flower with the same out-dir"
        ) from None


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the experiment; a run that fails is reported in one line and fails the ServerApp.

    Whatever stops the run (a ``RoundFailed`` under the strict policy, a lost SuperLink, a
    bug) is logged as one ``fedshift run FAILED`` line naming it and the run directory,
    then raised again, never swallowed: Flower 1.41 then marks the run ``finished:failed``
    (``flwr ls``, with the reason in its details) and ``flwr-serverapp`` logs "Exit Code:
    201" and exits with status 1. The run directory keeps its last checkpoint and gets no
    ``summary.json``, the mark of a run that did not finish. ``flwr run --stream`` itself
    exits 0 in Flower 1.41 whatever the run's end (docs/flower.md shows how to check it).
    """
    run_config = dict(context.run_config)
    try:
        summary, out_dir = run_on_grid(grid, run_config)
    except Exception as exc:
        reason = " ".join(f"{exc.__class__.__name__}: {exc}".split())[:2000]
        where = run_config.get("out-dir") or "a new one under runs/"
        log.error("fedshift run FAILED: %s (run directory: %s, no summary.json)", reason, where)
        raise
    log.warning("fedshift run directory: %s", out_dir)
    print(json.dumps({"run_dir": out_dir, **summary}, indent=2), flush=True)
