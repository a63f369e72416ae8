"""``--resume`` notices changed data (#47 item 4): ``config.json`` records a digest of each
client's decoded rows, and a domain whose data changed since the run started (one image
added, one image's content replaced) is refused in one line naming it, unless
``--force-data``."""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.cli import main
from fedshift.config import resolve
from fedshift.core.errors import CheckpointError
from fedshift.core.split import RowGather, Split
from fedshift.data.domains import Domain, DomainDataset
from fedshift.engine.assembly import prepare
from fedshift.engine.run.datadigest import changed_domains, domain_digest
from fedshift.engine.run.runner import Runner


def two_images() -> Split:
    x = torch.tensor([[[[1, 2]]], [[[3, 4]]]], dtype=torch.uint8)  # 2 images, 1x1x2
    return Split(x=x, y=torch.tensor([3, 1]))


def by_hand(split: Split) -> str:
    """The digest of a domain whose three splits are ``split``, written out byte by byte."""
    digest = hashlib.sha256()
    for name in ("train", "val", "test"):
        digest.update(name.encode())
        digest.update(b"(2, 1, 1, 2):torch.uint8")
        digest.update(bytes(split.x.flatten().tolist()))
        digest.update(b"labels")
        digest.update(np.array(split.y.tolist(), dtype=np.int64).tobytes())
        digest.update(b"no mask")
    return digest.hexdigest()[:32]


def test_client_digest_is_sha256_of_the_decoded_rows_and_labels():
    split = two_images()
    assert domain_digest(split, split, split) == by_hand(split)
    lazy = Split(x=RowGather([split.x], torch.tensor([0, 1])), y=split.y)
    assert domain_digest(lazy, lazy, lazy) == by_hand(split)  # what is read, not how it is held
    one_pixel = Split(x=split.x.clone(), y=split.y)
    one_pixel.x[1, 0, 0, 1] = 5
    swapped = Split(x=split.x.flip(0), y=split.y.flip(0))
    relabeled = Split(x=split.x, y=torch.tensor([3, 2]))
    for other in (one_pixel, swapped, relabeled):
        assert domain_digest(split, split, other) != by_hand(split)


def test_changed_domains_names_each_changed_added_or_removed_domain():
    saved = {"a": "x0", "b": "x1", "c": "x2"}
    assert changed_domains(saved, dict(saved)) == []
    assert changed_domains(None, saved) == []  # a run from before digests: not checked
    assert changed_domains(saved, {"a": "x0", "b": "y1", "c": "y2"}) == ["b", "c"]
    assert changed_domains(saved, {"a": "x0", "b": "x1"}) == ["c"]  # a domain gone
    assert changed_domains(saved, {**saved, "d": "x3"}) == ["d"]  # a domain added


def with_domain(dataset: DomainDataset, name: str, train: Split) -> DomainDataset:
    domains = dict(dataset.domains)
    old = domains[name]
    domains[name] = Domain(name=name, train=train, val=old.val, test=old.test)
    return DomainDataset(
        name=dataset.name,
        domains=domains,
        classes=dataset.classes,
        channels=dataset.channels,
        image_size=dataset.image_size,
        meta=dict(dataset.meta),
    )


def run(tmp_path, dataset, rounds, **kw):
    sets = [f"rounds={rounds}", "device=cpu", "batch_size=32"]
    cfg = resolve(None, {"algorithm": "fedavg", "target": "optdigits"}, sets)
    runner = Runner(prepare(cfg, dataset=dataset), tmp_path / "r", progress=False)
    return runner.run(**kw)


def test_resume_refuses_a_domain_whose_data_changed_unless_forced(tmp_path, tiny16_digits, caplog):
    assert run(tmp_path, tiny16_digits, 2, stop_after=1) == {}
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    digests = config["run_info"]["data_digests"]
    assert sorted(digests) == sorted(tiny16_digits.domains)
    assert all(len(d) == 32 and int(d, 16) >= 0 for d in digests.values())
    mnistm = tiny16_digits.domain("mnistm").train
    replaced = mnistm.x[:].clone()
    replaced[7] = replaced[8]  # one image's content replaced: same sizes everywhere
    changed = with_domain(tiny16_digits, "mnistm", Split(x=replaced, y=mnistm.y))
    kept = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir() if p.is_file()}
    with pytest.raises(CheckpointError, match=r"^cannot resume: the data of domain 'mnistm'"):
        run(tmp_path, changed, 2, resume=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir() if p.is_file()} == kept
    grown = Split(x=torch.cat([mnistm.x[:], mnistm.x[:1]]), y=torch.cat([mnistm.y, mnistm.y[:1]]))
    with pytest.raises(CheckpointError, match=r"data of domain 'mnistm' changed since"):
        run(tmp_path, with_domain(tiny16_digits, "mnistm", grown), 2, resume=True)
    target = tiny16_digits.domain("optdigits")  # no client trains on it: it is only scored
    relabeled = Split(x=target.test.x, y=(target.test.y + 1) % 10)
    domains = {
        **tiny16_digits.domains,
        "optdigits": Domain("optdigits", target.train, target.val, relabeled),
    }
    rescored = DomainDataset(
        tiny16_digits.name,
        domains,
        tiny16_digits.classes,
        tiny16_digits.channels,
        tiny16_digits.image_size,
        dict(tiny16_digits.meta),
    )
    with pytest.raises(CheckpointError, match="data of domain 'optdigits' changed"):
        run(tmp_path, rescored, 2, resume=True)
    with caplog.at_level(logging.WARNING):
        assert run(tmp_path, changed, 2, resume=True, force_data=True)["rounds"] == 2
    assert "--force-data: resuming on changed data (domains mnistm)" in caplog.text
    # config.json now records the data the run went on with: the next resume compares to it
    assert run(tmp_path, changed, 3, resume=True)["rounds"] == 3
    with pytest.raises(CheckpointError, match="domain 'mnistm'"):
        run(tmp_path, tiny16_digits, 4, resume=True)


def write_png(path, colour) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)


def test_cli_resume_on_an_image_folder_whose_files_changed(tmp_path, monkeypatch, capsys):
    """The audit's two cases on files: one image added to a domain, one image's content
    replaced (same name, same byte size); each a one-line refusal naming the domain."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    for domain in ("art", "photo", "sketch"):
        for cls in ("cat", "dog"):
            for i in range(6):
                colour = tuple(rng.integers(0, 255, 3).tolist())
                write_png(tmp_path / "tree" / domain / cls / f"{i}.png", colour)
    argv = ["run", "--out", "r", "--quiet", "--set", "device=cpu", "--set", "threads=1"]
    start = [*argv, "--dataset", "folder:tree", "--target", "sketch", "--rounds", "1"]
    start += ["--set", "image_size=8", "--set", "batch_size=4"]
    assert main(start) == 0, capsys.readouterr().err
    capsys.readouterr()
    resume = [*argv, "--resume", "--rounds", "2"]
    before = (tmp_path / "tree" / "photo" / "dog" / "3.png").read_bytes()
    write_png(tmp_path / "tree" / "photo" / "dog" / "3.png", (1, 2, 3))
    assert len((tmp_path / "tree" / "photo" / "dog" / "3.png").read_bytes()) == len(before)
    assert main(resume) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the data of domain 'photo'" in err[0], err
    (tmp_path / "tree" / "photo" / "dog" / "3.png").write_bytes(before)
    write_png(tmp_path / "tree" / "art" / "cat" / "6.png", (9, 9, 9))
    assert main(resume) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "domain 'art'" in err[0] and "--force-data" in err[0], err
    assert main([*resume, "--force-data"]) == 0, capsys.readouterr().err
    assert main([*argv[:4], "--force-data", "--dataset", "folder:tree"]) == 2
    assert "--force-data is for --resume" in capsys.readouterr().err


def test_flower_run_config_carries_force_data(tmp_path):
    """On Flower the option is the run config key ``force-data`` (with ``resume``)."""
    pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")
    from fedshift.core.errors import ConfigError
    from fedshift.engine.flower.serverapp import run_on_grid
    from fedshift.engine.flower.settings import parse_run_config

    assert parse_run_config({"resume": True, "force-data": True})[1].force_data
    assert not parse_run_config({"resume": True})[1].force_data
    with pytest.raises(ConfigError, match="--force-data is for --resume"):
        run_on_grid(None, {"force-data": True, "out-dir": str(tmp_path / "r")})  # no message
