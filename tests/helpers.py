"""Plain helpers shared by several test files (fixtures live in ``conftest.py``).

Imported as ``from helpers import ...``: pytest's default ``prepend`` import mode puts this
folder on ``sys.path`` when it loads ``tests/conftest.py``, which it does before collecting any
test below it; ``conftest.py`` adds every subfolder too (tests/README.md)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

from fedshift.config import resolve
from fedshift.core.algorithm import RunInfo
from fedshift.core.context import ClientContext, SplitView, TrainConfig
from fedshift.data.domains import Split
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.models import build_model

NAN = float("nan")

#: the number of classes of the ``synthetic`` fixture (a personalized task)
CLASSES = 4


def read_history(run_dir):
    """The per-round rows of a run directory's ``metrics.jsonl``."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# -- configurations and short runs ---------------------------------------------------------


def cfg(algorithm: str, **settings):
    """A LODO configuration: 2 rounds on the CPU, target optdigits, ``settings`` on top."""
    base = {"rounds": 2, "batch_size": 32, "device": "cpu", "target": "optdigits"}
    items = [f"{k}={v}" for k, v in {**base, **settings}.items()]
    return resolve(None, {"algorithm": algorithm}, items)


def run(tmp_path, name, dataset, algorithm, **settings):
    """Runs ``cfg(algorithm, **settings)`` on ``dataset`` into ``tmp_path / name``."""
    exp = prepare(cfg(algorithm, **settings), dataset=dataset)
    runner = Runner(exp, tmp_path / name, progress=False)
    return runner.run(), runner


def msst_cfg(algorithm: str = "fact", **overrides):
    """A multi-source single-target (msst) configuration with target optdigits."""
    settings = {"rounds": 2, "batch_size": 32, "device": "cpu", **overrides}
    flags = {"algorithm": algorithm, "target": "optdigits", "protocol": "msst"}
    return resolve(None, flags, [f"{k}={v}" for k, v in settings.items()])


def personalized_cfg(algorithm: str, **sets):
    """The config of a short personalized run: 3 N-way K-shot clients (2 ways, 6 shots),
    2 rounds, batch 8, on the CPU; ``sets`` override any of it."""
    settings = {
        "device": "cpu",
        "rounds": 2,
        "batch_size": 8,
        "partition": "nway-kshot",
        "clients_per_domain": 3,
        "ways": 2,
        "shots": 6,
        "stdev": 0,
        **sets,
    }
    return resolve(
        None,
        {"algorithm": algorithm, "protocol": "personalized"},
        [f"{k}={v}" for k, v in settings.items()],
    )


def run_personalized(tmp_path, synthetic, algorithm, name, **sets):
    """A short personalized run (:func:`personalized_cfg`) on the ``synthetic`` fixture:
    the summary, the per-round history and the experiment."""
    exp = prepare(personalized_cfg(algorithm, **sets), dataset=synthetic)
    runner = Runner(exp, tmp_path / name, progress=False)
    summary = runner.run()
    return summary, read_history(tmp_path / name), exp


# -- hand-made run information and client contexts ------------------------------------------


def run_info(seed: int = 0) -> RunInfo:
    """What an algorithm learns of its run: a small CNN for 10 classes of 3×32×32 images."""

    def build():
        torch.manual_seed(0)
        return build_model("cnn", 10, in_channels=3, image_size=32, embed_dim=16, width=0.25)

    return RunInfo(
        num_classes=10,
        build_model=build,
        train_cfg=TrainConfig(batch_size=8),
        total_rounds=4,
        seed=seed,
        device=torch.device("cpu"),
    )


def client_context(x: torch.Tensor, client_id: int = 0, seed: int = 0) -> ClientContext:
    """A labeled source client holding the images ``x`` (all of class 0) as its train split."""
    split = Split(x=x, y=torch.zeros(len(x), dtype=torch.int64))
    info = run_info()
    return ClientContext(
        client_id=client_id,
        name=f"c{client_id}",
        domain="d",
        role="source",
        train=SplitView(split, True, torch.device("cpu")),
        val=None,
        test=None,
        num_classes=10,
        build_model=info.build_model,
        rng=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
        train_cfg=info.train_cfg,
    )


# -- comparing numbers ---------------------------------------------------------------------


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, tol=1e-6) -> bool:
    """``actual`` (a tensor or number) equals ``expected`` (numbers, lists, arrays) within tol."""
    actual = torch.as_tensor(actual).detach().to(torch.float64)
    expected = torch.from_numpy(np.asarray(expected, dtype=np.float64))
    return actual.shape == expected.shape and torch.allclose(actual, expected, atol=tol)


#: smaller sizes for algorithms whose official defaults are costly on a tiny CPU task; the
#: code paths are the same (the defaults themselves are covered by each method's own tests)
FAST_SETTINGS = {
    "perada": {"algo.kd_steps": 5, "algo.kd_batch_size": 64},
    # FACT's default fact-cnn (fc layers of 8192x3072 and 3072x2048) dominates the contract and
    # precision tiers; tests/algorithms/test_fact.py runs it
    "fact": {"model": "cnn"},
    "fact-nf": {"model": "cnn"},
    "fedadg": {
        "algo.noise_dim": 64,
        "algo.rp_dim": 64,
        "algo.generator_hidden": 128,
        "algo.discriminator_hidden": 64,
    },
}


#: the repository's docs/ folder (its generator scripts run under mkdocs-gen-files)
DOCS = Path(__file__).resolve().parents[1] / "docs"


def run_docs_script(name: str, out: Path) -> Path:
    """Run generator script ``docs/NAME`` with mkdocs-gen-files stood in for, so the pages it
    writes land under ``out``; returns ``out``."""
    stand_in = types.ModuleType("mkdocs_gen_files")
    stand_in.open = lambda page, mode: (out / page).open(mode)
    saved = sys.modules.get("mkdocs_gen_files")
    sys.modules["mkdocs_gen_files"] = stand_in
    try:
        spec = importlib.util.spec_from_file_location(Path(name).stem, DOCS / name)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    finally:
        if saved is None:
            del sys.modules["mkdocs_gen_files"]
        else:
            sys.modules["mkdocs_gen_files"] = saved
    return out
