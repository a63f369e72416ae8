"""benchmarks/speed/vmap_ceiling.py --quick runs and prints its tables (CI smoke), and its bare
vmap round is the SGD it claims: stacked weights trained in place equal torch.optim.SGD."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "speed"


def _rows(lines: list[str]) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines if line[:3] == "| 4"]


def test_quick_vmap_ceiling_tables(in_tmp, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    ceiling = importlib.import_module("vmap_ceiling")
    lines = ceiling.main(["--quick", "--repeats", "2"])
    assert "4 clients x 16 samples, batch 8" in lines[0] and "CPU (" in lines[0]
    rows = _rows(lines)
    methods = {row[1]: row for row in rows if len(row) == 5 and "/" not in row[1]}
    assert list(methods) == list(ceiling.METHODS)
    for row in methods.values():
        assert float(row[2]) >= float(row[3]) > 0  # median >= min CPU-seconds
    ratios = {row[1]: row for row in rows if " / " in row[1]}
    assert list(ratios) == [f"{a} / {b}" for a, b in ceiling.PAIRS]
    for row in ratios.values():
        low, high = (float(x) for x in row[3].split("–"))
        assert low <= float(row[2]) <= high and row[4] == "2"


def test_bare_vmap_round_is_sgd_with_momentum_and_weight_decay(monkeypatch):
    """Two clients, one linear layer, two steps of batch 2 on hand-made data: the bare
    round's in-place _foreach update gives torch.optim.SGD's weights, client by client."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    ceiling = importlib.import_module("vmap_ceiling")
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    x = torch.arange(24, dtype=torch.float32).view(2, 4, 3) / 10
    y = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]])
    cfg = type("Cfg", (), {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "batch_size": 2})
    cfg.local_epochs = 1
    bare = object.__new__(ceiling.BareVmapRound)
    bare.device, bare.cfg, bare.x, bare.y = torch.device("cpu"), cfg, x, y
    bare.trainable = ["weight", "bias"]
    bare.global_ = {k: v.detach().clone() for k, v in layer.state_dict().items()}

    def loss(params, buffers, xb, yb):
        out = torch.func.functional_call(layer, {**params, **buffers}, (xb,))
        return torch.nn.functional.cross_entropy(out, yb)

    bare.losses = torch.func.vmap(loss)
    torch.manual_seed(1)
    order = torch.rand(2, 4).argsort(dim=1)  # the draw the round makes
    torch.manual_seed(1)
    assert bare() == 8
    expected = []
    for client in range(2):
        model = torch.nn.Linear(3, 2)
        model.load_state_dict(layer.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        for start in (0, 2):
            idx = order[client, start : start + 2]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[client, idx]), y[client, idx]).backward()
            opt.step()
        expected.append(model.state_dict())
    for key in ("weight", "bias"):
        want = (expected[0][key] + expected[1][key]) / 2
        torch.testing.assert_close(bare.global_[key], want, rtol=0, atol=1e-7)
