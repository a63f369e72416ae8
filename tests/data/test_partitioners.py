"""Partition schemes as a registry: one module per scheme, listed in
``fedshift.data.partitioners.PARTITIONERS``; a scheme declares the run keys it reads, and a run
passes it those keys of section ``partition`` only."""

from __future__ import annotations

import numpy as np
import pytest
from test_partition_skew import make_dataset

from fedshift.cli import main
from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.core.runconfig import section_keys
from fedshift.data.domains import DatasetError
from fedshift.data.partition import partition_domains
from fedshift.data.partitioners import PARTITIONERS, PerDomain
from fedshift.scenarios import build_scenario


class FirstHalf(PerDomain):
    """A scheme of a test: every client of a domain gets the first ``shots`` train samples."""

    name = "first-shots"
    help = "each client holds the domain's first `shots` train samples"
    keys = ("shots",)

    def split(self, dom, k, rng, options):
        head = np.arange(options["shots"])
        return [(head, np.arange(len(dom.val)), np.arange(len(dom.test)))] * k


def test_the_four_schemes_declare_run_keys_of_section_partition():
    assert list(PARTITIONERS) == ["iid", "dirichlet", "nway-kshot", "heterogeneity"]
    for scheme in PARTITIONERS.values():
        assert scheme.help and set(scheme.keys) <= set(section_keys("partition"))


def test_a_scheme_added_to_the_registry_runs_with_its_own_keys(monkeypatch, capsys):
    monkeypatch.setitem(PARTITIONERS, FirstHalf.name, FirstHalf())
    flags = {"partition": "first-shots", "clients_per_domain": 2, "target": "b"}
    cfg = resolve(None, flags, ["shots=7"])
    task = build_scenario(cfg, make_dataset(), pooled=False)
    assert [len(client.train) for client in task.clients] == [7, 7]
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "first-shots: each client holds the domain's first `shots` train samples (shots)" in (
        " ".join(capsys.readouterr().out.split())
    )


def test_an_unknown_scheme_or_option_is_one_error():
    with pytest.raises(
        ConfigError, match=r"unknown partition 'dirichlt' \(did you mean 'dirichlet'"
    ):
        resolve(None, {"partition": "dirichlt"}, [])
    with pytest.raises(DatasetError, match="unknown partition option 'alpha'; options: "):
        partition_domains(make_dataset(), ["a"], scheme="dirichlet", alpha=0.1)


def test_list_partitions_prints_each_scheme_with_its_run_keys(capsys):
    assert main(["list", "partitions"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert rows["nway-kshot"][:4] == ["ways,", "shots,", "stdev,", "test_shots"]
    assert rows["heterogeneity"][0] == "heterogeneity_lambda" and rows["iid"][0] == "-"
