"""Presets with the papers' settings and numbers: per-domain client counts and data fractions,
the mean of the last five evaluated rounds, and the paper's number beside fedshift's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_catalog_digit_five import _tree as _digit_five_tree

from fedshift.cli import main
from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.engine.run.selection import mean_of_last
from fedshift.presets import PRESET_DIR, load_preset, preset_names
from fedshift.report.table import format_summary
from fedshift.scenarios import build_scenario

REPO = Path(__file__).resolve().parents[2]


def clients_of(task) -> dict[str, int]:
    counts: dict[str, int] = {}
    for client in task.clients:
        counts[client.domain] = counts.get(client.domain, 0) + 1
    return counts


def test_clients_per_domain_mapping_allocates_exactly(digits):
    cfg = resolve(None, {"protocol": "per-domain"}, ["clients_per_domain=mnist:2,syn:3"])
    assert cfg.clients_per_domain == "mnist:2,syn:3"
    task = build_scenario(cfg, digits, pooled=False)
    assert clients_of(task) == {"mnist": 2, "mnistm": 1, "optdigits": 1, "syn": 3}
    for name in ("mnist", "syn"):
        mine = [c for c in task.clients if c.domain == name]
        assert sum(len(c.train) for c in mine) == len(digits.domain(name).train)
    table = resolve(
        None, {"protocol": "per-domain", "clients_per_domain": {"mnist": 2, "syn": 3}}, []
    )
    assert table.clients_per_domain == "mnist:2,syn:3"
    lodo = resolve(None, {"target": "mnistm"}, ["clients_per_domain=mnist:2,syn:1"])
    assert clients_of(build_scenario(lodo, digits, pooled=False)) == {
        "mnist": 2,
        "optdigits": 1,
        "syn": 1,
    }


def test_plain_int_clients_per_domain_still_works(digits):
    cfg = resolve(None, {"protocol": "per-domain"}, ["clients_per_domain=2"])
    assert cfg.clients_per_domain == 2
    assert set(clients_of(build_scenario(cfg, digits, pooled=False)).values()) == {2}


def test_client_data_fraction_per_domain(digits):
    whole = build_scenario(resolve(None, {"protocol": "per-domain"}, []), digits, pooled=False)
    cfg = resolve(None, {"protocol": "per-domain"}, ["client_data_fraction=mnist:0.1,syn:0.5"])
    part = build_scenario(cfg, digits, pooled=False)
    for full, kept in zip(whole.clients, part.clients, strict=True):
        share = {"mnist": 0.1, "syn": 0.5}.get(full.domain, 1.0)
        assert len(kept.train) == max(2, round(share * len(full.train)))


@pytest.mark.parametrize(
    "setting, message",
    [
        ("clients_per_domain=mnist:2,usps:1", "clients_per_domain names unknown domain 'usps'"),
        ("clients_per_domain=mnist:x", "clients_per_domain of domain 'mnist' expects int"),
        ("clients_per_domain=mnist:1.5", "clients_per_domain of domain 'mnist' expects int"),
        ("clients_per_domain=mnist:0", "clients_per_domain of domain 'mnist' must be >= 1"),
        ("clients_per_domain=mnist:2,mnist:3", "names domain 'mnist' twice"),
        ("clients_per_domain=mnist", "expects int or DOMAIN:INT"),
        ("clients_per_domain=0", "clients_per_domain must be >= 1"),
        ("client_data_fraction=syn:1.5", "client_data_fraction of domain 'syn' must be in"),
        ("client_data_fraction=syn:", "is not DOMAIN:FLOAT"),
        ("client_data_fraction=syrn:0.5", r"unknown domain 'syrn' \(did you mean 'syn'\?\)"),
    ],
)
def test_per_domain_values_are_one_line_errors(setting, message, digits):
    with pytest.raises(ConfigError, match=message):
        build_scenario(resolve(None, {"protocol": "per-domain"}, [setting]), digits, pooled=False)


def test_mean_of_last_five_evaluated_rounds():
    history = [
        {"round": r, "target_accuracy": acc, "per_domain_accuracy": {"a": acc, "b": 1 - acc}}
        for r, acc in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8], start=1)
    ]
    history.insert(5, {"round": 99, "target_accuracy": math.nan})  # not evaluated
    mean = mean_of_last(history)
    assert mean["rounds"] == 5
    assert mean["target_accuracy"] == pytest.approx((0.3 + 0.4 + 0.5 + 0.6 + 0.8) / 5)
    assert mean["per_domain_accuracy"]["b"] == pytest.approx(1 - 2.6 / 5)
    assert mean_of_last(history[:2])["target_accuracy"] == pytest.approx(0.15)


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_fpl_digits_dry_run_allocates_the_papers_20_clients(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    _digit_five_tree(tmp_path / "data")
    argv = ["run", "--preset", "fpl-digits", "--dry-run", "--set", f"data_root={tmp_path / 'data'}"]
    code, out, err = cli(argv, capsys)
    assert code == 0, err
    assert "# task: 20 clients" in out
    assert "# clients per domain: mnist 3, usps 7, svhn 6, syn 4" in out
    assert 'clients_per_domain = "mnist:3,usps:7,svhn:6,syn:4"' in out


#: the presets whose number PAPER-NUMBERS.md found, with it and the summary key it compares to
FOUND = {
    "moon-cifar10": (69.1, "target_accuracy_last"),
    "fedproto-mnist": (97.13, "personalized_accuracy"),
    "fpl-digits": (83.12, "target_accuracy_last5"),
    "fpl-office-caltech10": (61.63, "target_accuracy_last5"),
    "fact-digit-five": (92.9, "target_accuracy_min_idd"),
    "fada-digit-five": (62.5, "target_accuracy"),
    "perada-office-home": (83.6, "personalized_accuracy"),
    "ditto-office-home": (81.8, "personalized_accuracy"),
}


def test_the_eight_found_numbers_are_structured_and_listed(capsys):
    for name in preset_names():
        meta = load_preset(name).meta
        if name in FOUND:
            assert (meta["paper_value"], meta["paper_metric"]) == FOUND[name], name
            assert meta["paper_source"], name
        else:
            assert "paper_value" not in meta, name
            assert "not found" in meta["paper_result"], name
    code, out, _ = cli(["list", "presets"], capsys)
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    for name, (value, metric) in FOUND.items():
        assert f"{value:g} % {metric} (" in rows[name], rows[name]
    assert "FACT, Table 1, ->MNIST-M" in rows["fact-digit-five"]


def test_no_preset_or_doc_reads_27_55_as_a_deviation():
    texts = [path.read_text() for path in PRESET_DIR.glob("*.toml")]
    texts.append((REPO / "docs" / "presets.md").read_text())
    assert not any("27.55" in text for text in texts)
    assert load_preset("bd-fedproto-cifar10").settings["batch_size"] == 32


TINY = """
algorithm = "fedavg"
dataset = "digits-dg:mnist,syn"
target = "syn"
rounds = 1
batch_size = 32
client_data_fraction = 0.1
[preset]
paper = "a test"
setting = "digits-dg, two domains"
paper_result = "12.5 % (a test table)"
"""
NUMBER = """paper_value = 12.5
paper_metric = "target_accuracy_last5"
paper_source = "Test paper, Table 9, mean of 3 runs"
"""


def test_run_and_report_end_with_the_papers_number_beside_fedshifts(tmp_path, capsys):
    preset = tmp_path / "tiny.toml"
    preset.write_text(TINY + NUMBER)
    out = tmp_path / "runs" / "a"
    argv = ["run", "--preset", str(preset), "--quiet", "--out", str(out)]
    code, text, err = cli([*argv, "--set", "threads=1", "--set", "tracking=none"], capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    ours = f"{100 * summary['target_accuracy_last5']:.1f} %"
    line = (
        f"paper: 12.5 % (Test paper, Table 9, mean of 3 runs) · fedshift: {ours} "
        "target_accuracy_last5 (1 run, seed 0)"
    )
    assert line in text.splitlines()
    assert summary["target_accuracy_last5"] == summary["target_accuracy_last"]  # one round
    code, text, err = cli(["report", str(tmp_path / "runs")], capsys)
    assert code == 0, err
    assert f"{preset}: {line}" in text.splitlines()
    other = ["run", "--preset", str(preset), "--quiet", "-a", "fedprox", "--out", str(out) + "x"]
    code, text, err = cli([*other, "--set", "threads=1", "--set", "tracking=none"], capsys)
    assert code == 0, err
    assert "paper:" not in text  # another algorithm: the paper's number is not its


@pytest.mark.parametrize(
    "number, message",
    [
        ('paper_value = 12.5\npaper_metric = "target_accuracy"\n', "needs preset.paper_source"),
        (NUMBER.replace("12.5", '"12.5"'), "'preset.paper_value' must be a number"),
        (NUMBER.replace("12.5", "125"), "percentage in \\[0, 100\\]"),
        (NUMBER.replace("_last5", "_last6"), "unknown preset.paper_metric 'target_accuracy_last6'"),
    ],
)
def test_bad_paper_number_is_one_line(number, message, tmp_path):
    preset = tmp_path / "bad.toml"
    preset.write_text(TINY + number)
    with pytest.raises(ConfigError, match=message):
        load_preset(str(preset))


def test_result_table_shows_last5_and_the_algorithms_selection():
    summary = {
        "algorithm": "fact",
        "dataset": "digit-five",
        "protocol": "msst",
        "target": "mnistm",
        "seed": 0,
        "rounds": 9,
        "per_domain_accuracy": {"mnistm": 0.5},
        "selected_round": 2,
        "target_accuracy": 0.5,
        "target_accuracy_last": 0.4,
        "target_accuracy_last5": 0.45,
        "oracle_round": 1,
        "target_accuracy_oracle": 0.6,
        "target_accuracy_min_idd": 0.55,
        "min_idd_round": 3,
        "bytes_up": 1,
        "bytes_down": 1,
        "wall_seconds": 1.0,
        "samples_per_second": 1.0,
    }
    lines = format_summary(summary).splitlines()
    assert "target accuracy (mean of the last 5 evaluated rounds): 45.00" in lines
    selected = [line for line in lines if "label-free score" in line]
    assert selected == [
        "target accuracy (min_idd selected, round 3; the algorithm's label-free score): 55.00"
    ]


def test_per_domain_counts_survive_config_json_and_resume(tmp_path, capsys):
    out = str(tmp_path / "run")
    common = ["--set", "threads=1", "--set", "tracking=none", "--quiet", "--out", out]
    given = ["--set", "clients_per_domain=mnist: 2, syn:1", "--set", "client_data_fraction=0.1"]
    code, _, err = cli(["run", "--rounds", "1", *given, *common], capsys)
    assert code == 0, err
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["clients_per_domain"] == "mnist:2,syn:1"
    code, _, err = cli(["run", "--resume", "--rounds", "2", *given, *common], capsys)
    assert code == 0, err
    code, _, err = cli(["run", "--resume", "--set", "clients_per_domain=mnist:3", *common], capsys)
    assert code == 2 and "cannot change clients_per_domain" in err
