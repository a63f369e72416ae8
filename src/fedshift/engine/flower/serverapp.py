"""The Flower ``ServerApp``: the algorithm's server program over a :class:`FlowerFederation`.

It runs :func:`fedshift.engine.runner.run_experiment` (setup, rounds, evaluation,
per-round checkpoints, summary) with the Flower federation instead of the in-process one,
so a Flower run writes the same run directory as ``fedshift run``. Setting the run config
key ``resume=true`` with the same ``out-dir`` continues a killed run from its last
completed round.
"""

from __future__ import annotations

import json
import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedshift.algorithms import REGISTRY
from fedshift.config import ConfigError
from fedshift.engine.flower.federation import FlowerFederation
from fedshift.engine.flower.settings import load_run_dataset, parse_run_config
from fedshift.engine.runner import run_experiment

log = logging.getLogger(__name__)

app = ServerApp()


def run_on_grid(grid: Grid, run_config: dict) -> tuple[dict, str]:
    """Run the experiment described by a Flower run config over ``grid``.

    Returns the summary and the run directory (the summary is empty when the run was
    stopped early).
    """
    cfg, opts = parse_run_config(run_config)
    if REGISTRY[cfg.algorithm].personal:
        raise ConfigError(
            f"{cfg.algorithm!r} is evaluated with each client's own model, which stays on its "
            "SuperNode; the Flower engine evaluates global models only"
        )
    summary, out_dir = run_experiment(
        cfg,
        opts.out_dir or None,
        resume=opts.resume,
        progress=False,
        dataset=load_run_dataset(cfg, opts),
        federation=lambda exp: FlowerFederation(grid, exp, opts),
    )
    return summary, str(out_dir)


@app.main()
def main(grid: Grid, context: Context) -> None:
    summary, out_dir = run_on_grid(grid, dict(context.run_config))
    log.warning("fedshift run directory: %s", out_dir)
    print(json.dumps({"run_dir": out_dir, **summary}, indent=2), flush=True)
