"""Paper presets: every shipped file resolves against the run config and its algorithm's
hyperparameters; ``fedshift list presets``; precedence preset < --config < flags < --set;
one-line errors for unknown names, malformed files and missing data; runs record the
preset and its hash."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import tomllib
from pathlib import Path

import pytest
import torch
from PIL import Image
from test_catalog_loaders import _pacs_tree

import fedshift
from fedshift.algorithms import REGISTRY
from fedshift.cli import main
from fedshift.config import check_preset, resolve
from fedshift.core.errors import ConfigError
from fedshift.data import digits
from fedshift.data.catalog import CATALOG
from fedshift.models import build_model
from fedshift.presets import META_KEYS, PRESET_DIR, load_preset, preset_names

REPO = Path(__file__).resolve().parents[2]
#: catalog entries other branches add; a preset may name them before they are merged here
PENDING_DATASETS = ("digit-five", "fundus", "prostate")


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_preset(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


TINY = """
algorithm = "fedprox"
dataset = "digits-dg:mnist,syn"
target = "syn"
rounds = 3
lr = 0.05
batch_size = 32
client_data_fraction = 0.1
[algo]
mu = 0.1
[preset]
paper = "a test"
setting = "digits-dg, two domains"
paper_result = "none"
"""


def test_presets_ship_and_include_the_required_experiments():
    names = preset_names()
    required = {
        "fedsr-pacs",
        "fedga-pacs",
        "fedga-office-home",
        "ccst-pacs",
        "feddg-elcfs-fundus",
        "feddg-elcfs-prostate",
        "fpl-digits",
        "fpl-office-caltech10",
        "fact-digit-five",
        "fact-office-caltech10",
        "fada-digit-five",
        "fada-office-caltech10",
        "fedproto-mnist",
        "moon-cifar10",
        "bd-fedproto-cifar10",
        "perada-office-home",
        "ditto-office-home",
        "fedadg-pacs",
    }
    assert required <= set(names)


def test_pyproject_ships_the_preset_files_as_package_data():
    """A non-editable install copies only declared package data: every preset must match."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["fedshift.presets"]
    for path in PRESET_DIR.glob("*.toml"):
        assert any(fnmatch.fnmatch(path.name, p) for p in patterns), path.name


def _domains(dataset: str) -> tuple[str, ...] | None:
    """The domains a dataset name offers, where this checkout knows them."""
    base, _, only = dataset.partition(":")
    if base in CATALOG:
        known = CATALOG[base].domains
    elif base == digits.NAME:
        known = tuple(digits.DOMAINS)
    else:
        assert base in PENDING_DATASETS, f"unknown dataset {base!r}"
        return None
    if only:
        picked = tuple(d.strip() for d in only.split(","))
        assert set(picked) <= set(known), picked
        return picked
    return known


@pytest.mark.parametrize("name", preset_names())
def test_every_shipped_preset_resolves_with_valid_values(name):
    preset = load_preset(name)
    cfg = check_preset(preset)
    assert cfg.algorithm in REGISTRY
    assert set(cfg.algo) == set(REGISTRY[cfg.algorithm].Hparams.__dataclass_fields__)
    for key, required in META_KEYS.items():
        if required:
            assert preset.meta.get(key, "").strip(), f"{name}: [preset] needs {key}"
    domains = _domains(cfg.dataset)
    if domains is not None:
        named = [d for d in cfg.sources.split(",") if d]
        if cfg.target not in ("all", "clients"):
            named.append(cfg.target)
        if cfg.server_data:
            named.append(cfg.server_data.split(":")[0])
        assert set(named) <= set(domains), (name, named, domains)


def test_list_presets_prints_one_line_each(capsys):
    code, out, _ = cli(["list", "presets"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["name", "algorithm", "dataset"]
    assert len(lines) == len(preset_names()) + 1
    for name, line in zip(preset_names(), lines[1:], strict=True):
        preset = load_preset(name)
        assert line.split()[:3] == [name, preset.algorithm, preset.dataset]
        assert (preset.paper_number or preset.meta["paper_result"]) in line
    assert "69.1" in next(line for line in lines if line.startswith("moon-cifar10"))


def test_precedence_preset_config_flags_set(tmp_path):
    preset = write_preset(tmp_path / "tiny.toml", TINY)
    config = tmp_path / "exp.toml"
    config.write_text("rounds = 4\nseed = 7\n[algo]\nmu = 0.2\n")
    cfg = resolve(None, {"preset": str(preset)}, [])
    assert (cfg.algorithm, cfg.rounds, cfg.lr, cfg.batch_size, cfg.algo["mu"]) == (
        "fedprox",
        3,
        0.05,
        32,
        0.1,
    )
    assert cfg.preset == str(preset)
    assert cfg.preset_sha256 == hashlib.sha256(preset.read_bytes()).hexdigest()
    cfg = resolve(str(config), {"preset": str(preset), "rounds": 2}, ["lr=0.02", "algo.mu=0.3"])
    assert (cfg.rounds, cfg.seed, cfg.lr, cfg.batch_size, cfg.algo["mu"]) == (2, 7, 0.02, 32, 0.3)
    assert cfg.target == "syn"
    via_set = resolve(None, {}, [f"preset={preset}"])
    assert (via_set.rounds, via_set.preset) == (3, str(preset))
    assert resolve(None, {}, []).preset_sha256 == ""


def test_another_algorithm_leaves_the_preset_hyperparameters_out(tmp_path):
    preset = write_preset(tmp_path / "tiny.toml", TINY)
    cfg = resolve(None, {"preset": str(preset), "algorithm": "fedavg"}, [])
    assert (cfg.algorithm, cfg.lr, cfg.algo) == ("fedavg", 0.05, {})


def test_unknown_preset_name_is_one_line_listing_the_presets(capsys):
    code, _, err = cli(["run", "--preset", "fedsr-pac"], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert "unknown preset 'fedsr-pac'" in err and "did you mean 'fedsr-pacs'" in err
    assert all(name in err for name in preset_names())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rounds = [", "is not valid TOML"),
        ('learning_rate = 0.1\n[preset]\npaper = "x"', "unknown key 'learning_rate'"),
        ('algorithm = "fedprox"\n[algo]\nmuu = 0.1', "muu"),
        ('[preset]\npapers = "x"', "unknown key 'preset.papers'"),
        ("[training]\nepochs = 1", "unknown table 'training'"),
        ('[optimizer]\nname = "sgd"', "run key 'optimizer' takes a value, not a table"),
        ("rounds = 0", "rounds must be >= 1"),
        ('partition = "random"', "partition"),
        ('preset = "fedsr-pacs"', "cannot start from another preset"),
        ('preset_sha256 = "00"', "'preset_sha256' records the preset"),
    ],
)
def test_bad_user_preset_is_one_line_naming_file_and_key(text, expected, tmp_path, capsys):
    preset = write_preset(tmp_path / "bad.toml", text)
    code, _, err = cli(["run", "--preset", str(preset), "--dry-run"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fedshift: error: ")
    assert str(preset) in err and expected in err


def test_missing_user_preset_file_is_one_line(tmp_path, capsys):
    code, _, err = cli(["run", "--preset", str(tmp_path / "none.toml")], capsys)
    assert code == 2 and "preset file" in err and "does not exist" in err


def test_catalog_preset_without_data_is_the_datasets_check_message(tmp_path, capsys):
    code, _, err = cli(["run", "--preset", "fedsr-pacs", "--quiet"], capsys)
    assert code == 2
    assert "give --set data_root=PATH" in err and "fedshift datasets check pacs" in err
    nowhere = str(tmp_path / "nowhere")
    code, _, err = cli(["run", "--preset", "fedsr-pacs", "--set", f"data_root={nowhere}"], capsys)
    check_code, _, check_err = cli(["datasets", "check", "pacs", "--root", nowhere], capsys)
    assert code == check_code == 2
    assert err == check_err and nowhere in err
    broken = tmp_path / "broken"
    broken.mkdir()
    code, _, err = cli(["run", "--preset", "moon-cifar10", "--set", f"data_root={broken}"], capsys)
    check_code, _, check_err = cli(["datasets", "check", "cifar10", "--root", str(broken)], capsys)
    assert code == check_code == 2 and err == check_err


def test_user_preset_runs_and_config_records_it(tmp_path, capsys):
    preset = write_preset(tmp_path / "tiny.toml", TINY)
    out = tmp_path / "run"
    argv = ["run", "--preset", str(preset), "--rounds", "1", "--quiet", "--out", str(out)]
    code, _, err = cli([*argv, "--set", "threads=1", "--set", "tracking=none"], capsys)
    assert code == 0, err
    saved = json.loads((out / "config.json").read_text())
    assert saved["preset"] == str(preset)
    assert saved["preset_sha256"] == hashlib.sha256(preset.read_bytes()).hexdigest()
    assert (saved["algorithm"], saved["rounds"], saved["lr"], saved["algo"]["mu"]) == (
        "fedprox",
        1,
        0.05,
        0.1,
    )
    assert len(fedshift.load_run(out).history) == 1


def test_library_plan_and_load_preset(tmp_path):
    preset = write_preset(tmp_path / "tiny.toml", TINY)
    task = fedshift.plan(preset=str(preset), threads=1)
    assert (task.config.algorithm, task.targets) == ("fedprox", ["syn"])
    loaded = fedshift.load_preset("moon-cifar10")
    assert loaded.settings["algo.mu"] == 5.0 and "moon-cifar10" in fedshift.preset_names()
    with pytest.raises(ConfigError, match="unknown preset"):
        fedshift.plan(preset="no-such-preset")


def test_shipped_fedsr_pacs_preset_runs_one_round_on_generated_pacs(tmp_path, monkeypatch):
    """The shipped preset end to end, on a tiny PACS copy, with a small CNN in place of the
    ImageNet ResNet-18 (no weights file in tests)."""
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    _pacs_tree(tmp_path / "pacs")
    out = tmp_path / "run"
    argv = ["run", "--preset", "fedsr-pacs", "--rounds", "1", "--model", "cnn"]
    argv += ["--quiet", "--out", str(out)]
    for setting in (
        f"data_root={tmp_path / 'pacs'}",
        "model_weights=",
        "image_size=32",
        "batch_size=4",
        "threads=1",
        "tracking=none",
    ):
        argv += ["--set", setting]
    assert main(argv) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["preset"] == "fedsr-pacs"
    assert (saved["algorithm"], saved["target"], saved["model"]) == ("fedsr", "art_painting", "cnn")
    assert saved["algo"]["alpha_cmi"] == 0.001 and saved["lr"] == 0.01
    shipped = (PRESET_DIR / "fedsr-pacs.toml").read_bytes()
    assert saved["preset_sha256"] == hashlib.sha256(shipped).hexdigest()


def _folder_tree(name: str, root: Path) -> None:
    """ROOT/<domain>/<class>/<image>, 3 classes x 6 images per domain."""
    for domain in CATALOG[name].domains:
        for label, cls in enumerate(("bike", "cup", "pen")):
            for i in range(6):
                path = root / domain / cls / f"{i:03d}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (8, 8), (label * 80, i * 40, len(domain) * 20)).save(path)


GENERATED = {"pacs": _pacs_tree, "office-home": None, "office-caltech10": None}


@pytest.mark.parametrize(
    "name", [n for n in preset_names() if load_preset(n).dataset.split(":")[0] in GENERATED]
)
def test_catalog_presets_build_their_task_on_a_generated_copy(name, tmp_path, monkeypatch, capsys):
    """Each shipped preset on a generated copy of its dataset: domains, protocol and partition
    build (``--dry-run``); ImageNet weights are left out (no weights file in tests)."""
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    dataset = load_preset(name).dataset
    make_tree = GENERATED[dataset] or (lambda root: _folder_tree(dataset, root))
    make_tree(tmp_path / "data")
    argv = ["run", "--preset", name, "--dry-run", "--set", f"data_root={tmp_path / 'data'}"]
    argv += ["--set", "model_weights=", "--set", "image_size=64"]
    if load_preset(name).algorithm == "perada":
        code, _, err = cli(argv, capsys)
        assert code == 2 and "perada needs a pretrained backbone" in err
        weights = tmp_path / "backbone.pt"
        model = build_model(load_preset(name).settings["model"], 3, image_size=64)
        torch.save(model.state_dict(), weights)
        argv += ["--set", f"algo.backbone={weights}"]
    code, out, err = cli(argv, capsys)
    assert code == 0, err
    assert f'preset = "{name}"' in out and "# task:" in out


def test_docs_table_lists_every_preset_with_its_number():
    """docs/presets.md stays true: one table row per shipped preset, with its paper's number."""
    rows = {
        line.split("|")[1].strip(" `"): line
        for line in (REPO / "docs" / "presets.md").read_text().splitlines()
        if line.startswith("| `")
    }
    assert set(rows) == set(preset_names())
    for name, line in rows.items():
        meta = load_preset(name).meta
        assert meta["paper_result"] in line and meta["setting"] in line, name
