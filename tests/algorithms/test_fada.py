"""FADA: its losses, the MINE bound, attention weights and dispersion (exact numbers)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import run_info
from torch import nn

from fedshift.algorithms.fada import (
    FADA,
    FADAHparams,
    attention_weights,
    log_dispersion,
    mine_lower_bound,
    negative_entropy,
)
from fedshift.core.federation import Federation
from fedshift.core.record import Record


def test_fada_losses_and_attention():
    assert negative_entropy(torch.zeros(3, 4)).item() == pytest.approx(-math.log(4.0))
    statistics = nn.Linear(2, 1)
    with torch.no_grad():
        statistics.weight.copy_(torch.tensor([[1.0, 0.0]]))  # T(p, q) = p
        statistics.bias.zero_()
    p, q = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [5.0]])
    bound = mine_lower_bound(statistics, p, q, torch.tensor([1, 0]))
    expected = 1.5 - (math.log(math.e + math.e**2) - math.log(2.0))
    assert bound.item() == pytest.approx(expected, rel=1e-6)
    assert attention_weights([0.0, math.log(3.0)]) == pytest.approx([0.25, 0.75])
    x = torch.tensor([[0.0], [2.0], [10.0], [12.0]])
    assert log_dispersion(x, 2, 10, torch.Generator().manual_seed(0)) == pytest.approx(
        math.log(4.0)
    )


class ScriptedFederation(Federation):
    """Sources 0 and 1 and target 2, answering FADA's four tasks with hand-made replies;
    records what each task was sent."""

    def __init__(self, sources: dict[int, dict[str, torch.Tensor]], gains, aligned):
        self.sources, self.gains, self.aligned = sources, gains, aligned
        self.round, self.total_rounds, self.sent = 1, 1, {}

    def clients(self, role="source"):
        return [2] if role == "target" else [0, 1]

    def sample(self, k=None, role="source"):
        return [0, 1]

    def call(self, task, ids, record, fold=None):
        self.sent[task] = record
        metrics = {"num-examples": 4, "loss": 0.5}
        if task == "features":
            return {2: Record(arrays={"features": torch.ones(4, 16)}, metrics=metrics)}
        if task == "train":
            return {
                cid: Record(metrics=metrics)
                .with_arrays("model", self.sources[cid])
                .with_arrays("identifier", {"0.weight": torch.full((3, 16), float(cid))})
                for cid in ids
            }
        if task == "attention":
            return {2: Record(arrays={"gain": torch.tensor(self.gains)}, metrics=metrics)}
        return {2: Record(metrics=metrics).with_arrays("model", self.aligned)}


def test_fada_round_weights_sources_by_the_softmax_of_their_gap_gains():
    """The server step that defines FADA's dynamic attention, on hand-made replies: gains
    0 and ln 3 give α = (1/4, 3/4); the new C and D are the α-weighted mean of the sources'
    (every non-backbone weight), the target's aligned G replaces the backbone, and the
    target's alignment step receives α and the sources' domain identifiers in order."""
    algo = FADA(FADAHparams(), run_info(0))
    state = algo.init_state()
    floats = {k: v for k, v in state.model.items() if v.is_floating_point()}
    sources = {cid: {k: v + cid + 1.0 for k, v in floats.items()} for cid in (0, 1)}
    for cid in sources:
        sources[cid].update({k: v for k, v in state.model.items() if not v.is_floating_point()})
    aligned = {k: torch.full_like(v, 7.0) for k, v in floats.items() if k.startswith("backbone.")}
    fed = ScriptedFederation(sources, [0.0, math.log(3.0)], aligned)
    new, metrics = algo.round(state, fed)
    assert metrics["attention.0"] == pytest.approx(0.25) and metrics[
        "attention.1"
    ] == pytest.approx(0.75)
    for key, value in floats.items():
        expected = aligned[key] if key in aligned else value + 0.25 * 1.0 + 0.75 * 2.0
        assert torch.allclose(new.model[key], expected, atol=1e-6), key
    align = fed.sent["align"]
    assert torch.allclose(align.arrays["attention"], torch.tensor([0.25, 0.75]))
    for i in (0, 1):
        assert torch.equal(
            align.subset(f"identifiers.{i}")["0.weight"], torch.full((3, 16), float(i))
        )
    assert set(fed.sent["attention"].subset("sources.1")) == {
        k for k in state.model if k.startswith("backbone.")
    }
