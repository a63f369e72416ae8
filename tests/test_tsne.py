"""The t-SNE report: it rebuilds a finished run and marks the global prototypes."""

from __future__ import annotations

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
