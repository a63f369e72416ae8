"""The t-SNE report: it rebuilds a finished run and marks the global prototypes."""

from __future__ import annotations

import pytest
from helpers import run_personalized


def test_tsne_plot_rebuilds_the_run_and_marks_global_prototypes(tmp_path, synthetic, monkeypatch):
    from fedshift.engine import assembly
    from fedshift.report import tsne

    run_personalized(tmp_path, synthetic, "fedproto", "plot", rounds=1)
    monkeypatch.setattr(assembly, "load_dataset", lambda *a, **k: synthetic)
    exp, state, round_ = tsne.load_run(tmp_path / "plot")
    embedding = tsne.collect(exp, state, per_client=5)
    assert round_ == 1 and embedding.prototypes_are_global
    assert embedding.features.shape == (15, 256) and len(embedding.client_names) == 3
    path = tsne.plot_tsne(tmp_path / "plot", tmp_path / "fig.png", per_client=5)
    assert path.stat().st_size > 1000


def test_tsne_with_target_adds_the_held_out_domain_embedded_by_the_global_model(
    tmp_path, micro_digits, synthetic, monkeypatch
):
    from fedshift.config import resolve
    from fedshift.core.errors import ConfigError
    from fedshift.engine import assembly
    from fedshift.engine.run.runner import Runner
    from fedshift.report import tsne

    cfg = resolve(None, {"target": "optdigits"}, ["rounds=1", "device=cpu", "tracking=none"])
    Runner(assembly.prepare(cfg, dataset=micro_digits), tmp_path / "lodo", progress=False).run()
    monkeypatch.setattr(assembly, "load_dataset", lambda *a, **k: micro_digits)
    exp, state, _ = tsne.load_run(tmp_path / "lodo")
    plain = tsne.collect(exp, state, per_client=5)
    embedding = tsne.collect(exp, state, per_client=5, with_target=True)
    assert embedding.targets == 1 and plain.targets == 0
    assert embedding.client_names == [*plain.client_names, "optdigits (target)"]
    assert "optdigits" not in {c.domain for c in exp.scenario.clients}
    assert embedding.features.shape[0] == plain.features.shape[0] + 5
    assert (embedding.prototypes == plain.prototypes).all()  # class means of clients only
    path = tsne.plot_tsne(tmp_path / "lodo", tmp_path / "t.png", per_client=5, with_target=True)
    assert path.stat().st_size > 1000

    run_personalized(tmp_path, synthetic, "fedproto", "personal", rounds=1)
    monkeypatch.setattr(assembly, "load_dataset", lambda *a, **k: synthetic)
    exp, state, _ = tsne.load_run(tmp_path / "personal")
    with pytest.raises(ConfigError, match="no held-out target domain"):
        tsne.collect(exp, state, per_client=5, with_target=True)
