"""Experiment loggers beside ``metrics.jsonl``: the run key ``tracking``.

``tracking`` is a comma list of ``tensorboard`` (the default), ``wandb`` and ``mlflow``, or
``none``. Each logger gets every numeric value of each round's metrics line (the dict written
to ``metrics.jsonl``; nested dicts such as ``per_domain_accuracy`` flattened to
``per_domain_accuracy/mnist``) with step = round, and at the end the run config (flattened)
with the summary's figures. Everything stays inside the run directory and nothing touches the
network:

* TensorBoard: event files in ``RUN_DIR/tensorboard``; a resumed run purges the steps after
  its checkpoint, so no round is logged twice.
* W&B: an offline run in ``RUN_DIR/wandb`` (``wandb sync`` uploads it later, if you wish).
* MLflow: a SQLite store ``RUN_DIR/mlflow.db`` (``mlflow ui --backend-store-uri
  sqlite:///RUN_DIR/mlflow.db``).

W&B and MLflow get one run per session: a resumed run starts a new one (W&B: same group,
job type ``resume``; MLflow: tagged with the first session's run as its parent) holding the
rounds from its first new round on.

A logger that fails (a full disk, a broken install) must not lose the run: it is warned
about once, in one line, and switched off; metrics.jsonl and the checkpoints go on.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from fedshift.core.runconfig import tracking_loggers

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
MLFLOW_DB = "mlflow.db"
#: the experiment (MLflow) and project (W&B) a run is logged under
PROJECT = "fedshift"


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level, keys joined by ``/`` (``per_domain_accuracy/mnist``)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def numeric(values: dict[str, Any], skip: tuple[str, ...] = ("round",)) -> dict[str, float]:
    """The numbers of a metrics line or summary, flattened, as floats (``skip`` left out)."""
    return {
        key: float(value)
        for key, value in flatten(values).items()
        if key not in skip and isinstance(value, int | float)
    }


def hparam_values(config: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """The run config as flat scalars (``algo/proto_weight``), what loggers take as params."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in flatten(config).items():
        out[key] = value if isinstance(value, bool | int | float | str) else str(value)
    return out


class TensorBoardLogger:
    """Scalars per round in ``RUN_DIR/tensorboard``; the config as hparams at the end."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, config: dict[str, Any], first_round: int):
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run drops whatever an earlier session logged from its first new round on
        purge = first_round if first_round > 1 else None
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge)
        self.config = config

    def log_round(self, round_: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=round_)
        self.writer.flush()

    def finish(self, summary: dict[str, float], last_round: int) -> None:
        from torch.utils.tensorboard.summary import hparams

        finals = {f"summary/{k}": v for k, v in summary.items() if math.isfinite(v)}
        for part in hparams(hparam_values(self.config), finals):
            self.writer.file_writer.add_summary(part)
        for key, value in finals.items():
            self.writer.add_scalar(key, value, global_step=last_round)

    def close(self, failed: bool) -> None:
        self.writer.close()


class WandbLogger:
    """An offline W&B run in ``RUN_DIR/wandb``: the config, one history row per round, and
    the summary. Offline mode never opens a network connection."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict[str, Any], first_round: int):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        settings = wandb.Settings(
            mode="offline",
            silent=True,
            console="off",
            disable_git=True,
            save_code=False,
            x_disable_stats=True,
        )
        (run_dir / WANDB_DIR).mkdir(exist_ok=True)
        self.run = wandb.init(
            dir=str(run_dir),
            project=PROJECT,
            name=run_dir.name,
            group=run_dir.name,
            job_type="resume" if first_round > 1 else "run",
            config=config,
            settings=settings,
            reinit="create_new",
        )

    def log_round(self, round_: int, values: dict[str, float]) -> None:
        self.run.log(values, step=round_)

    def finish(self, summary: dict[str, float], last_round: int) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in summary.items()})

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowLogger:
    """A local MLflow store ``RUN_DIR/mlflow.db`` (SQLite), one MLflow run per session: the
    flattened config as params, metrics per round with step = round, the summary at the end."""

    name = "mlflow"

    def __init__(self, run_dir: Path, config: dict[str, Any], first_round: int):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        # after the import, which sets mlflow's own level: no schema set-up chatter
        for quiet in ("mlflow", "alembic"):
            logging.getLogger(quiet).setLevel(logging.WARNING)

        self.client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / MLFLOW_DB).resolve()}")
        experiment = self.client.get_experiment_by_name(PROJECT)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(PROJECT)
        )
        # the store lies in the run directory: its runs are this run's sessions, one each
        # (a resumed session starts a new MLflow run, so no step is logged twice in one)
        earlier = self.client.search_runs([experiment_id], order_by=["attributes.start_time"])
        tags = {"fedshift.session": str(len(earlier) + 1), "fedshift.first_round": str(first_round)}
        if earlier:
            tags["mlflow.parentRunId"] = earlier[0].info.run_id
        name = run_dir.name if not earlier else f"{run_dir.name}-resume{len(earlier)}"
        self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in hparam_values(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, step) for k, v in values.items()]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def log_round(self, round_: int, values: dict[str, float]) -> None:
        self._log(values, round_)

    def finish(self, summary: dict[str, float], last_round: int) -> None:
        self._log({f"summary/{k}": v for k, v in summary.items()}, last_round)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


LOGGERS = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "mlflow": MlflowLogger}


class Tracking:
    """The run's loggers behind one door; a logger that raises is warned about once and
    dropped, so tracking never stops a run. ``seconds[phase][logger]`` is the time each
    logger spent in each phase (``start``, ``log a round``, ``log the summary``, ``close``)."""

    def __init__(self, tracking: str, run_dir: Path, config: dict[str, Any], first_round: int):
        self.loggers: list[Any] = []
        self.seconds: dict[str, dict[str, float]] = {"start": {}}
        for name in tracking_loggers(tracking):
            started = time.perf_counter()
            try:
                self.loggers.append(LOGGERS[name](Path(run_dir), config, first_round))
            except Exception as exc:  # any logger failure is survivable
                self._warn(name, "could not start", exc)
            self.seconds["start"][name] = time.perf_counter() - started

    @staticmethod
    def _warn(name: str, what: str, exc: BaseException) -> None:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        log.warning("tracking: %s %s (%s); it logs nothing more for this run", name, what, text)

    def _each(self, what: str, call) -> None:
        for logger in list(self.loggers):
            started = time.perf_counter()
            try:
                call(logger)
            except Exception as exc:  # see the class docstring
                self.loggers.remove(logger)
                self._warn(logger.name, f"failed to {what}", exc)
                if what != "close":
                    self._close_quietly(logger)
            spent = self.seconds.setdefault(what, {})
            spent[logger.name] = spent.get(logger.name, 0.0) + time.perf_counter() - started

    def _close_quietly(self, logger) -> None:
        try:
            logger.close(failed=True)
        except Exception as exc:  # already warned about it
            log.debug("tracking: closing %s failed: %s", logger.name, exc)

    def log_round(self, entry: dict[str, Any]) -> None:
        """One metrics.jsonl line: its numbers at step = its round."""
        values = numeric(entry)
        self._each("log a round", lambda logger: logger.log_round(int(entry["round"]), values))

    def finish(self, summary: dict[str, Any]) -> None:
        """The run's summary figures (next to the config, where a logger shows hparams)."""
        values = numeric(summary, skip=("seed", "rounds"))
        last = int(summary.get("rounds", 0))
        self._each("log the summary", lambda logger: logger.finish(values, last))

    def close(self, failed: bool = False) -> None:
        """Close every logger (the run finished, stopped early or failed)."""
        self._each("close", lambda logger: logger.close(failed))
        self.loggers = []
