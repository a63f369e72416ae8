"""Label-skew partitions (N-way K-shot, Dirichlet on one domain), ``name:domain`` datasets and
the personalized protocol's per-client test sets, on small synthetic datasets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.data import registry
from fedshift.data.domains import DatasetError, Domain, DomainDataset, Split
from fedshift.data.partition import partition_domains
from fedshift.scenarios import build_scenario

CLASSES = 6


def make_split(per_class: int, seed: int) -> Split:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(CLASSES).repeat_interleave(per_class)
    x = torch.randint(0, 256, (len(y), 3, 8, 8), dtype=torch.uint8, generator=gen)
    return Split(x=x, y=y)


def make_dataset(domains=("a", "b"), train=30, val=4, test=5) -> DomainDataset:
    return DomainDataset(
        name="synth",
        domains={
            d: Domain(d, make_split(train, i), make_split(val, 10 + i), make_split(test, 20 + i))
            for i, d in enumerate(domains)
        },
        classes=[str(c) for c in range(CLASSES)],
        channels=3,
        image_size=8,
    )


def nway(dataset, k=5, seed=0, **kw):
    return partition_domains(
        dataset, ["a"], clients_per_domain=k, scheme="nway-kshot", seed=seed, **kw
    )


def test_nway_kshot_without_spread_gives_exact_ways_and_shots():
    ds = make_dataset()
    specs = nway(ds, k=4, ways=3, shots=7, stdev=0)
    y = ds.domain("a").train.y
    for spec in specs:
        labels, counts = torch.unique(y[spec.train_idx], return_counts=True)
        assert len(labels) == 3
        assert counts.tolist() == [7, 7, 7]


def test_nway_kshot_spread_stays_in_the_official_ranges():
    ds = make_dataset(train=200)
    specs = nway(ds, k=40, ways=3, shots=4, stdev=2)
    y = ds.domain("a").train.y
    ways, shots = set(), set()
    for spec in specs:
        labels, counts = torch.unique(y[spec.train_idx], return_counts=True)
        assert len(set(counts.tolist())) == 1, "one shot count per client"
        ways.add(len(labels))
        shots.add(int(counts[0]))
    # ways: max(2, 3 - 2) .. min(6, 3 + 2); shots: 4 - 2 .. 4 + 2
    assert ways <= {2, 3, 4, 5} and len(ways) >= 3
    assert shots <= {2, 3, 4, 5, 6} and len(shots) >= 4


def test_nway_kshot_train_disjoint_and_eval_shares_are_the_clients_classes():
    ds = make_dataset()
    specs = nway(ds, k=5, ways=2, shots=5, stdev=1)
    dom = ds.domain("a")
    all_train = np.concatenate([s.train_idx for s in specs])
    assert len(all_train) == len(set(all_train.tolist()))
    for spec in specs:
        classes = torch.unique(dom.train.y[spec.train_idx])
        expected_test = torch.nonzero(torch.isin(dom.test.y, classes)).flatten().numpy()
        expected_val = torch.nonzero(torch.isin(dom.val.y, classes)).flatten().numpy()
        assert np.array_equal(spec.test_idx, expected_test)
        assert np.array_equal(spec.val_idx, expected_val)


def test_nway_kshot_test_shots_are_disjoint_per_class_blocks_and_leave_train_unchanged():
    ds = make_dataset(test=12)
    plain = nway(ds, k=5, ways=2, shots=5, stdev=1)
    specs = nway(ds, k=5, ways=2, shots=5, stdev=1, test_shots=3)
    dom = ds.domain("a")
    for before, after in zip(plain, specs, strict=True):  # drawn after every train share
        assert np.array_equal(before.train_idx, after.train_idx)
        assert np.array_equal(before.val_idx, after.val_idx)
        classes = torch.unique(dom.train.y[after.train_idx])
        labels, counts = torch.unique(dom.test.y[after.test_idx], return_counts=True)
        assert labels.tolist() == classes.tolist() and counts.tolist() == [3] * len(classes)
    all_test = np.concatenate([s.test_idx for s in specs])
    assert len(all_test) == len(set(all_test.tolist()))  # no test image serves two clients


def test_nway_kshot_test_shots_beyond_the_test_split_is_one_error():
    ds = make_dataset(test=5)  # 5 test images per class, 6 clients x 2+ ways x 3 shots
    with pytest.raises(DatasetError, match="too few test samples left .* test_shots=3"):
        nway(ds, k=6, ways=3, shots=2, stdev=0, test_shots=3)
    with pytest.raises(DatasetError, match="test_shots must be >= 0"):
        nway(ds, test_shots=-1)


def test_nway_kshot_is_deterministic_per_seed():
    ds = make_dataset()
    first = [s.train_idx for s in nway(ds, seed=3, shots=4)]
    again = [s.train_idx for s in nway(ds, seed=3, shots=4)]
    other = [s.train_idx for s in nway(ds, seed=4, shots=4)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"k": 20, "ways": 5, "shots": 10, "stdev": 0}, "too few train samples"),
        ({"ways": 1, "stdev": 0}, "at least 2 classes"),
        ({"ways": 0}, "ways >= 1"),
        ({"shots": 0}, "shots >= 1"),
        ({"stdev": -1}, "stdev >= 0"),
    ],
)
def test_nway_kshot_errors_say_what_is_wrong(kw, message):
    with pytest.raises(DatasetError, match=message):
        nway(make_dataset(), **kw)


def test_dirichlet_label_skew_on_a_single_domain():
    ds = registry.restrict_domains(make_dataset(train=40), ["b"])
    assert ds.domain_names == ["b"]
    specs = partition_domains(
        ds, ["b"], clients_per_domain=4, scheme="dirichlet", dirichlet_alpha=0.1
    )
    y = ds.domain("b").train.y
    sizes = [len(s.train_idx) for s in specs]
    assert sum(sizes) == len(y)
    # strong skew: no client holds every class in equal measure
    per_client = [torch.bincount(y[s.train_idx], minlength=CLASSES) for s in specs]
    assert all(int(c.max()) > 2 * max(1, int(c.min())) for c in per_client)


def test_dataset_name_with_domains_restricts(monkeypatch):
    synthetic = make_dataset(domains=("mnist", "syn", "optdigits"))
    monkeypatch.setattr(registry.digits, "load_digits_dg", lambda cache_dir=None: synthetic)
    ds = registry.load_dataset("digits-dg:syn,mnist")
    assert ds.domain_names == ["syn", "mnist"]
    assert ds.name == "synth:syn,mnist"
    with pytest.raises(DatasetError, match="unknown domain 'nope'"):
        registry.load_dataset("digits-dg:nope")
    with pytest.raises(DatasetError, match="repeat"):
        registry.load_dataset("digits-dg:syn,syn")


def personalized_cfg(**sets):
    settings = [f"{k}={v}" for k, v in {"device": "cpu", **sets}.items()]
    return resolve(None, {"algorithm": "fedavg", "protocol": "personalized"}, settings)


def test_personalized_protocol_tests_each_client_on_its_own_classes():
    cfg = personalized_cfg(partition="nway-kshot", clients_per_domain=3, ways=2, shots=5, stdev=1)
    assert cfg.target == "clients"
    ds = make_dataset()
    task = build_scenario(cfg, ds, pooled=False)
    assert task.per_client and len(task.clients) == 6
    for client in task.clients:
        own = set(torch.unique(client.train.y).tolist())
        assert set(torch.unique(client.test.y).tolist()) == own
        assert set(torch.unique(client.val.y).tolist()) == own
        # every test sample of those classes in the client's domain
        domain_test = ds.domain(client.domain).test.y
        assert len(client.test) == int(torch.isin(domain_test, torch.tensor(sorted(own))).sum())


def test_personalized_protocol_with_dirichlet_keeps_test_labels_within_train_labels():
    cfg = personalized_cfg(partition="dirichlet", dirichlet_alpha=0.1, clients_per_domain=3)
    task = build_scenario(
        cfg, registry.restrict_domains(make_dataset(train=40), ["a"]), pooled=False
    )
    for client in task.clients:
        own = set(torch.unique(client.train.y).tolist())
        assert set(torch.unique(client.test.y).tolist()) <= own


def test_personalized_protocol_rejects_a_held_out_target():
    cfg = personalized_cfg(target="a")
    with pytest.raises(ConfigError, match="own test share"):
        build_scenario(cfg, make_dataset(), pooled=False)
