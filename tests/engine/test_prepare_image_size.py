"""``prepare(cfg, dataset=...)`` honours the run key ``image_size`` as loading by name does: a
dataset handed in at another size is resized, so the model and its images agree (before, the
model was built for ``image_size`` and every client failed on a shape error)."""

from __future__ import annotations

from helpers import read_history

from fedshift.config import resolve
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner


def test_a_dataset_handed_in_is_resized_to_the_runs_image_size(tmp_path, micro_digits):
    assert micro_digits.image_size == 32
    flags = {"algorithm": "fedavg", "target": "optdigits"}
    cfg = resolve(None, flags, ["rounds=1", "batch_size=32", "device=cpu", "image_size=16"])
    exp = prepare(cfg, dataset=micro_digits)
    sides = {tuple(ctx.train.x.shape[-2:]) for ctx in exp.contexts.values()}
    assert sides == {(16, 16)}
    summary = Runner(exp, tmp_path / "run", progress=False).run()
    assert summary["failed_clients"] == 0
    assert len(read_history(tmp_path / "run")) == 1
