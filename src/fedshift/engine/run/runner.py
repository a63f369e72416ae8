"""The round loop of a run: rounds, evaluation, checkpoints after each round, metrics and
the summary in the run directory (config.json, metrics.jsonl, summary.json, checkpoint.pt)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fedshift.core.errors import CheckpointError, ConfigError, RoundFailed, RunInterrupted
from fedshift.core.privacy import run_epsilon
from fedshift.core.runconfig import RENAMED_KEYS, RunConfig
from fedshift.core.runfiles import RunFiles, resume_conflict
from fedshift.core.state import (
    CHECKPOINT_FORMAT,
    ServerState,
    load_checkpoint,
    save_checkpoint,
)
from fedshift.data.domains import DomainDataset
from fedshift.engine.assembly import Experiment, prepare
from fedshift.engine.evaluation import at_chance, evaluate, personal_eval_every
from fedshift.engine.federation import BaseFederation
from fedshift.engine.run.datadigest import changed_domains, check_resume_data, data_digests
from fedshift.engine.run.rundir import check_run_dir, claim_run_dir, settle_run_dir
from fedshift.engine.run.selection import (
    LAST,
    ORACLE,
    SOURCE_VAL,
    mean_of_last,
    score_selection,
    select,
)
from fedshift.engine.run.tracking import Tracking
from fedshift.engine.simulation.dispatch import SimulationFederation

log = logging.getLogger(__name__)


def default_run_name(cfg: RunConfig) -> str:
    return f"{cfg.algorithm}-{Path(cfg.dataset).name}-{cfg.target}-s{cfg.seed}"


def unique_dir(base: Path) -> Path:
    if not base.exists():
        return base
    for i in range(2, 10_000):
        candidate = base.with_name(f"{base.name}-{i}")
        if not candidate.exists():
            return candidate
    raise ConfigError(f"too many runs named {base}")


def check_resume_config(saved: dict[str, Any], cfg: RunConfig) -> None:
    """Refuse to resume with settings other than the checkpoint's, as each key's resume rule
    says (:func:`fedshift.core.runfiles.resume_conflict`: device, threads and tracking may
    change; more rounds than saved extend the run)."""
    saved = {RENAMED_KEYS.get(k, k): v for k, v in saved.items()}
    now = cfg.to_dict()
    defaults = RunConfig().to_dict()
    # a key added after the checkpoint was written: the run used its default
    saved.update({k: defaults[k] for k in now if k not in saved and k in defaults})
    diffs = [k for k in now if resume_conflict(k, saved.get(k), now[k])]
    if diffs:
        k = diffs[0]
        raise CheckpointError(
            f"cannot resume: config differs from the checkpoint ({k}: saved {saved.get(k)!r}, "
            f"now {now[k]!r}); resume with the same settings or start a new run"
        )


def check_resume_clients(saved: list[dict] | None, now: list[dict]) -> None:
    """Refuse to resume on other data than the run trained on: each client's name, domain,
    role and train/val/test sizes recorded in its ``config.json`` (``run_info.clients``) must
    be today's. A changed dataset copy, or a fedshift that splits it otherwise (e.g. a test
    part held out where the whole domain was tested), would otherwise continue the run on
    different data without a word. A run whose config.json has no client list is not
    checked."""
    if not saved:
        return
    for index in range(max(len(saved), len(now))):
        before = saved[index] if index < len(saved) else None
        after = now[index] if index < len(now) else None
        if before != after:
            raise CheckpointError(
                f"cannot resume: the clients' data differ from the run's (client {index}: "
                f"saved {before}, now {after}); the dataset copy or fedshift's split of it "
                "changed: start a new run"
            )


class Runner:
    """Drives one experiment through its rounds with checkpoints after each round."""

    def __init__(
        self,
        exp: Experiment,
        out_dir: Path,
        *,
        progress: bool = True,
        fed: BaseFederation | None = None,
    ):
        """``fed`` is the engine's federation (e.g. Flower's); default: in-process."""
        self.exp = exp
        self.out = out_dir
        self.progress = progress
        self.fed = fed if fed is not None else SimulationFederation.for_experiment(exp)
        self.fed.server_data = exp.server_data
        self.progress_bar: tqdm | None = None
        self.tracking: Tracking | None = None  # the loggers of the latest run() (timings)
        #: whether the latest checkpoint holds the client states as they are now
        self._states_saved = False

    @property
    def checkpoint_path(self) -> Path:
        return RunFiles(self.out).checkpoint

    def _save(self, round_: int, state: ServerState, history: list[dict], wall: float) -> None:
        save_checkpoint(
            {
                "format": CHECKPOINT_FORMAT,
                "round": round_,
                "config": self.exp.cfg.to_dict(),
                "server": state.to_dict(),
                "clients": {str(cid): ctx.state for cid, ctx in self.exp.contexts.items()},
                "counters": {
                    "bytes_up": self.fed.bytes_up,
                    "bytes_down": self.fed.bytes_down,
                    "samples": self.fed.samples,
                    "wall_seconds": wall,
                },
                "history": history,
            },
            self.checkpoint_path,
        )

    def _check_data(self, digests: dict[str, str], force_data: bool) -> None:
        """Refuse to resume on other data than the run started on (sizes, then digests);
        with ``force_data`` a change is one warning and ``config.json`` records the new data,
        so the next resume compares against it."""
        files = RunFiles(self.out)
        saved = files.read_config() or {}
        info = saved.get("run_info") if isinstance(saved.get("run_info"), dict) else {}
        if not force_data:
            check_resume_data(info.get("data_digests"), digests)
            check_resume_clients(info.get("clients"), self.exp.info["clients"])
            return
        changed = changed_domains(info.get("data_digests"), digests)
        if changed or info.get("clients") != self.exp.info["clients"]:
            log.warning(
                "--force-data: resuming on changed data (domains %s); config.json now records it",
                ", ".join(changed) or "with other split sizes",
            )
            new_info = {**info, "clients": self.exp.info["clients"], "data_digests": digests}
            files.write_config({**saved, "run_info": new_info})

    def _restore(self) -> tuple[int, ServerState, list[dict], float]:
        data = load_checkpoint(self.checkpoint_path)
        check_resume_config(data["config"], self.exp.cfg)
        for cid, ctx in self.exp.contexts.items():
            ctx.state = dict(data["clients"].get(str(cid), {}))
        counters = data["counters"]
        self.fed.bytes_up = counters["bytes_up"]
        self.fed.bytes_down = counters["bytes_down"]
        self.fed.samples = counters["samples"]
        return (
            data["round"],
            ServerState.from_dict(data["server"]),
            list(data["history"]),
            counters["wall_seconds"],
        )

    def run(
        self, *, resume: bool = False, stop_after: int | None = None, force_data: bool = False
    ) -> dict[str, Any]:
        """Run (or continue) all rounds; ``stop_after`` ends early (to test resuming);
        ``force_data`` resumes even when the clients' data changed since the run started."""
        cfg, algo, fed = self.exp.cfg, self.exp.algorithm, self.fed
        self.out.mkdir(parents=True, exist_ok=True)
        self._states_saved = False
        digests = data_digests(self.exp.dataset)
        if resume:
            start, state, history, wall = self._restore()
            self._check_data(digests, force_data)
            self._record_rounds(cfg.rounds)
        else:
            info = {**self.exp.info, "data_digests": digests}
            RunFiles(self.out).write_config({**cfg.to_dict(), "run_info": info})
            start, history, wall = 0, [], 0.0
            fed.begin_round(0)
            state = algo.init_state()
            state = algo.setup(state, fed)
        self._write_metrics(history)
        tracking = self.tracking = Tracking(
            cfg.tracking, self.out, cfg.to_dict(), first_round=start + 1
        )
        failed = True
        try:
            summary = self._rounds(start, state, history, wall, tracking, stop_after)
            failed = False
        finally:
            tracking.close(failed)
        return summary

    def _rounds(
        self,
        start: int,
        state: ServerState,
        history: list[dict],
        wall: float,
        tracking: Tracking,
        stop_after: int | None,
    ) -> dict[str, Any]:
        """Rounds ``start + 1 ..``: each one's metrics line to metrics.jsonl and the loggers;
        then the summary (empty when ``stop_after`` ends the run early)."""
        cfg, fed = self.exp.cfg, self.fed
        bar = self.progress_bar = tqdm(
            total=cfg.rounds,
            initial=start,
            desc=f"{cfg.algorithm} -> {cfg.target}",
            unit="round",
            disable=not self.progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        for round_ in range(start + 1, cfg.rounds + 1):
            t0, cpu0 = time.perf_counter(), time.process_time()
            fed.begin_round(round_)
            state, train_metrics = self._round(state, round_)
            entry: dict[str, Any] = {"round": round_}
            entry.update({k: float(v) for k, v in train_metrics.items()})
            if round_ % cfg.eval_every == 0 or round_ == cfg.rounds:
                every = personal_eval_every(cfg, len(self.exp.contexts))
                personal = round_ % every == 0 or round_ == cfg.rounds
                sources = round_ % cfg.source_eval_every == 0 or round_ == cfg.rounds
                entry.update(
                    evaluate(self.exp, state, fed.score_clients, personal=personal, sources=sources)
                )
            entry["bytes_up"] = fed.bytes_up
            entry["bytes_down"] = fed.bytes_down
            entry["failed_clients"] = len(fed.failures)
            privacy = self.exp.algorithm.run.privacy
            if privacy is not None:
                pool = len(fed.clients("source"))
                sampled = min(pool, max(1, round(cfg.fraction * pool)))
                entry["dp_epsilon"] = run_epsilon(privacy, round_, sampled / pool)
            wall += time.perf_counter() - t0
            # CPU seconds of this process (all its threads): the cost of a round on a shared
            # machine, where wall time depends on what else runs
            entry["cpu_seconds"] = round(time.process_time() - cpu0, 3)
            entry["seconds"] = round(time.perf_counter() - t0, 3)
            history.append(entry)
            self._states_saved = round_ % cfg.checkpoint_every == 0 or round_ == cfg.rounds
            if self._states_saved:
                self._save(round_, state, history, wall)
            self._append_metrics(entry)
            tracking.log_round(entry)
            bar.update(1)
            bar.set_postfix(progress_postfix(entry))
            if stop_after is not None and round_ >= stop_after and round_ < cfg.rounds:
                bar.close()
                return {}
        bar.close()
        summary = self.summarize(history, wall)
        RunFiles(self.out).write_summary(summary)
        tracking.finish(summary)
        return summary

    def _round(self, state: ServerState, round_: int) -> tuple[ServerState, dict[str, float]]:
        """One round of the algorithm; a failed round (``RoundFailed``) restores every client
        state held here to its start of round, so the last checkpoint stays consistent with
        them, and says where the run can be resumed.

        Only the clients a call of the round reaches can change, so only theirs are kept,
        as each call is dispatched (:meth:`_keep_rollback`)."""
        before: dict[int, dict | None] = {}
        self.fed.on_dispatch = lambda ids: self._keep_rollback(before, ids)
        try:
            return self.exp.algorithm.round(state, self.fed)
        except RoundFailed as exc:
            kept = (
                "client states kept as they were"
                if self._roll_back_clients(before)
                else ("client states could not be restored: resume from the checkpoint")
            )
            files = RunFiles(self.out)
            if not files.has_checkpoint():  # resuming would only start the same run again
                raise RoundFailed(
                    f"{exc}; the run stopped in round {round_} before its first checkpoint: "
                    "see the warnings above, fix their cause, then run the same command "
                    "again (it starts over from round 1)"
                ) from None
            back = (
                f", or roll back one checkpoint (when the last one is poisoned) with: "
                f"fedshift run --out {self.out} --resume previous"
                if files.previous_checkpoint.is_file()
                else ""
            )
            raise RoundFailed(
                f"{exc}; the run stopped in round {round_} (the last checkpoint is kept; "
                f"{kept}): see the warnings above, then resume with --resume --out "
                f"{self.out}{back}"
            ) from None
        finally:
            self.fed.on_dispatch = None

    def _keep_rollback(self, before: dict[int, dict | None], ids: list[int]) -> None:
        """Keep the start-of-round state of each client in ``ids`` not kept yet: a shallow
        copy (the tensors a task replaces stay alive through it, the ones it leaves are
        shared), or None when the latest checkpoint holds the client states as they are
        now (saved after the previous round), so a failed round reads them back from there
        instead of holding a second copy of every changed state for the whole round."""
        for cid in ids:
            if cid in before or cid not in self.exp.contexts:
                continue
            before[cid] = None if self._states_saved else dict(self.exp.contexts[cid].state)

    def _roll_back_clients(self, before: dict[int, dict | None]) -> bool:
        """Put back the start-of-round states kept by :meth:`_keep_rollback`; False (with a
        warning) when the checkpoint they are to be read from is unreadable."""
        saved = None
        for cid, kept in before.items():
            if kept is None:
                if saved is None:
                    try:
                        saved = load_checkpoint(self.checkpoint_path, fallback=False)["clients"]
                    except CheckpointError as exc:
                        log.warning("cannot restore the client states: %s", exc)
                        return False
                kept = dict(saved.get(str(cid), {}))
            self.exp.contexts[cid].state = kept
        return True

    def close_progress(self) -> None:
        """End the progress bar's line, so an error after it is printed on a line of its own."""
        if self.progress_bar is not None:
            self.progress_bar.close()

    def _record_rounds(self, rounds: int) -> None:
        """A resumed run extended to more rounds: ``config.json`` says so (rest kept)."""
        files = RunFiles(self.out)
        saved = files.read_config()
        if saved is not None and saved.get("rounds") != rounds:
            files.write_config({**saved, "rounds": rounds})

    def _write_metrics(self, history: list[dict]) -> None:
        RunFiles(self.out).write_metrics(history)

    def _append_metrics(self, entry: dict) -> None:
        RunFiles(self.out).append_metrics(entry)

    def summarize(self, history: list[dict], wall: float) -> dict[str, Any]:
        cfg = self.exp.cfg
        chosen = select(history, SOURCE_VAL)
        last = select(history, LAST)
        oracle = select(history, ORACLE)
        last_mean = mean_of_last(history)
        summary = {
            "algorithm": cfg.algorithm,
            "dataset": cfg.dataset,
            "protocol": cfg.protocol,
            "target": cfg.target,
            "seed": cfg.seed,
            "rounds": cfg.rounds,
            "model_selection": "source-val",
            "target_accuracy": chosen["target_accuracy"],
            "selected_round": chosen["round"],
            "target_accuracy_last": last["target_accuracy"],
            "target_accuracy_last5": last_mean["target_accuracy"],
            "target_accuracy_oracle": oracle["target_accuracy"],
            "oracle_round": oracle["round"],
            "source_val_accuracy": chosen["source_val_accuracy"],
            "per_domain_accuracy": chosen["per_domain_accuracy"],
            "per_domain_accuracy_last": last["per_domain_accuracy"],
            "per_domain_accuracy_last5": last_mean["per_domain_accuracy"],
            "bytes_up": self.fed.bytes_up,
            "bytes_down": self.fed.bytes_down,
            "bytes_per_round": (self.fed.bytes_up + self.fed.bytes_down) / max(cfg.rounds, 1),
            "failed_clients": sum(h.get("failed_clients", 0) for h in history),
            "wall_seconds": round(wall, 3),
            "cpu_seconds": round(sum(h.get("cpu_seconds", 0.0) for h in history), 3),
            "samples_per_second": round(self.fed.samples / wall, 1) if wall > 0 else 0.0,
            "device": str(self.exp.device),
        }
        for key, row in (("at_chance", chosen), ("at_chance_last", last)):
            if at_chance(self.exp, row.get("per_domain_accuracy")):
                summary[key] = True  # one class predicted for every image: say so
        if self.exp.algorithm.run.privacy is not None:
            summary["dp_epsilon"] = history[-1]["dp_epsilon"]
            summary["dp_delta"] = cfg.dp_delta
        if "personalized_accuracy" in last:
            summary["personalized_accuracy"] = last["personalized_accuracy"]
            summary["personalized_accuracy_std"] = last["personalized_accuracy_std"]
        if cfg.problem == "segmentation":  # the "accuracy" figures are Dice scores
            summary["problem"] = cfg.problem
            summary["target_dice"] = chosen["target_accuracy"]
            summary["target_dice_last"] = last["target_accuracy"]
            summary["per_domain_dice"] = chosen["per_domain_accuracy"]
            for key in ("target_channel_dice", "per_domain_channel_dice"):
                if key in chosen:
                    summary[key] = chosen[key]
        algo = self.exp.algorithm
        picked = None
        if algo.selection:
            rule = score_selection(algo.selection, algo.selection_lower_is_better)
            picked = rule.pick(history)
        if picked is not None:
            summary[f"target_accuracy_{algo.selection}"] = picked["target_accuracy"]
            summary[f"{algo.selection}_round"] = picked["round"]
            if cfg.model_selection == "algorithm":  # the paper's own rule reports the run
                summary["target_accuracy_source_val"] = summary["target_accuracy"]
                summary.update(
                    model_selection=algo.selection,
                    target_accuracy=picked["target_accuracy"],
                    selected_round=picked["round"],
                    per_domain_accuracy=picked["per_domain_accuracy"],
                )
        return summary


def run_experiment(
    cfg: RunConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    roll_back: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    cache_dir: str | None = None,
    dataset: DomainDataset | None = None,
    federation: Callable[[Experiment], BaseFederation] | None = None,
    force_data: bool = False,
) -> tuple[dict[str, Any], Path]:
    """Build and run; returns the summary (empty if stopped early) and the run directory.

    ``roll_back`` (with ``resume``) first makes the previous checkpoint the latest again
    (:meth:`RunFiles.roll_back`), so the run continues from the round before it.

    ``federation`` builds the engine's federation from the experiment (the Flower
    ServerApp passes one); default: the in-process simulation engine.

    ``force_data`` (with ``resume``) continues even when the clients' data changed since
    the run started (see :mod:`fedshift.engine.run.datadigest`).
    """
    if resume and out is None:
        raise ConfigError("--resume needs --out RUN_DIR (the run to continue)")
    if out is None:
        out_dir = unique_dir(Path("runs") / default_run_name(cfg))
    else:
        out_dir = Path(out)
    if roll_back and not resume:
        raise ConfigError("rolling back to the previous checkpoint needs resume")
    if force_data and not resume:
        raise ConfigError("--force-data is for --resume (a new run records the data it uses)")
    check_run_dir(out_dir, resume=resume)
    if roll_back:
        RunFiles(out_dir).check_roll_back()
    exp = prepare(cfg, cache_dir=cache_dir, dataset=dataset)
    with claim_run_dir(out_dir):
        resume = settle_run_dir(out_dir, resume=resume)
        if roll_back:
            RunFiles(out_dir).roll_back()
        fed = federation(exp) if federation is not None else None
        runner = Runner(exp, out_dir, progress=progress, fed=fed)
        try:
            summary = runner.run(resume=resume, stop_after=stop_after, force_data=force_data)
            return summary, out_dir
        except KeyboardInterrupt:
            raise RunInterrupted(out_dir, RunFiles(out_dir).has_checkpoint()) from None
        finally:
            runner.close_progress()


#: the progress bar's figures: its label -> the round entry's key
PROGRESS_FIGURES = {"loss": "train_loss", "target": "target_accuracy"}


def progress_postfix(entry: dict[str, Any]) -> dict[str, str]:
    """The figures a round's progress bar shows: those the round measured (a round that is
    not evaluated has no target accuracy, and shows none rather than ``nan``)."""
    return {label: f"{entry[key]:.3f}" for label, key in PROGRESS_FIGURES.items() if key in entry}
