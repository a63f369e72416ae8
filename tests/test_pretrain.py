"""``fedshift pretrain``: the weights file and its provenance sidecar."""

from __future__ import annotations

import torch

from fedshift.pretrain import read_sidecar


def test_pretrain_writes_weights_and_provenance(backbone):
    meta = read_sidecar(backbone)
    assert meta["domain"] == "syn" and meta["model"] == "cnn"
    state = torch.load(backbone, weights_only=True)
    assert any(k.startswith("backbone.") for k in state)
