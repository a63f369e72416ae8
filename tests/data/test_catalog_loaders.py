"""Catalog datasets loaded for a run from generated trees in each authors' exact layout.

Every image is a real 8x8 JPEG whose colour encodes its class, so a decoded image tells which
label it must carry.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.cli import main
from fedshift.core.split import dense
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import CATALOG, DOMAINNET10_CLASSES, FOLDER_DATASETS, check_dataset


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch) -> Path:
    """Each test's own image cache (``$FEDSHIFT_CACHE``), never the user's."""
    folder = tmp_path / "fedshift-cache"
    monkeypatch.setenv("FEDSHIFT_CACHE", str(folder))
    return folder / "catalog"


FOLDER_CLASSES = ("bird", "Alarm_Clock", "car")  # created unsorted; the label order is sorted
IMAGES_PER_CLASS = 5
DOMAINNET_CLASSES = ("aircraft_carrier", "zebra", "bird")  # official label order, not sorted


def _colour(name: str) -> tuple[int, int]:
    """The red and green of class ``name``'s images (blue tells the images apart)."""
    return (sum(map(ord, name)) * 37 % 256, len(name) * 20 % 256)


def _jpeg(path: Path, name: str, index: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    colour = (*_colour(name), 40 * index % 256)
    Image.new("RGB", (8, 8), colour).save(path, format="JPEG", quality=100)


def _folder_tree(name: str, root: Path) -> None:
    for domain in CATALOG[name].domains:
        base = root / domain / "images" if name == "office31" else root / domain
        for cls in FOLDER_CLASSES:
            for i in range(IMAGES_PER_CLASS):
                _jpeg(base / cls / f"{domain}_{i:03d}.jpg", cls, i)


def _domainnet_tree(root: Path) -> dict[str, dict[str, list[str]]]:
    """Official-format lists: 4 train and 1 test image per class; returns the list lines."""
    lines = {}
    for domain in CATALOG["domainnet"].domains:
        lines[domain] = {"train": [], "test": []}
        for label, cls in enumerate(DOMAINNET_CLASSES):
            for i in range(5):
                relative = f"{domain}/{cls}/{domain}_{label:03d}_{i:06d}.jpg"
                _jpeg(root / relative, cls, i)
                lines[domain]["test" if i == 4 else "train"].append(f"{relative} {label}")
        for split, rows in lines[domain].items():
            (root / f"{domain}_{split}.txt").write_text("\n".join(rows) + "\n")
    return lines


def _pacs_tree(root: Path) -> None:
    """The kfold lists with 1-based labels: 3 train, 1 crossval, all 4 in test_kfold."""
    for domain in CATALOG["pacs"].domains:
        rows = []
        for label, cls in ((1, "dog"), (3, "giraffe")):
            for i in range(4):
                relative = f"{domain}/{cls}/pic_{i:03d}.jpg"
                _jpeg(root / "kfold" / relative, cls, i)
                rows.append(f"{relative} {label}")
        train = [r for r in rows if not r.split()[0].endswith("3.jpg")]
        (root / f"{domain}_train_kfold.txt").write_text("\n".join(train) + "\n")
        crossval = [r for r in rows if r.split()[0].endswith("3.jpg")]
        (root / f"{domain}_crossval_kfold.txt").write_text("\n".join(crossval) + "\n")
        (root / f"{domain}_test_kfold.txt").write_text("\n".join(rows) + "\n")


def test_pacs_kfold_lists_one_based_in_the_authors_order(tmp_path):
    _pacs_tree(tmp_path)
    ds = load_dataset("pacs", data_root=tmp_path, image_size=8)
    assert ds.classes[:3] == ["dog", "elephant", "giraffe"]
    sketch = ds.domains["sketch"]
    assert (len(sketch.train), len(sketch.val), len(sketch.test)) == (6, 2, 8)
    assert sorted(set(sketch.test.y.tolist())) == [0, 2]
    _labels_match_colours(ds)
    assert ds.meta["counts"]["photo"] == {"train": 6, "val": 2, "test": 8}


def _labels_match_colours(ds) -> None:
    """Each decoded image's colour is its class's colour: labels follow the class order."""
    for domain in ds.domains.values():
        for split in (domain.train, domain.val, domain.test):
            for x, y in zip(split.x, split.y, strict=True):
                expected = torch.tensor(_colour(ds.classes[int(y)]), dtype=torch.float32)
                assert (x[:2].float().mean(dim=(1, 2)) - expected).abs().max() < 12


@pytest.mark.parametrize("name", FOLDER_DATASETS)
def test_folder_datasets_domainbed_holdout_and_the_whole_domain_as_test(name, tmp_path):
    _folder_tree(name, tmp_path)
    ds = load_dataset(name, data_root=tmp_path, image_size=8, seed=0)
    assert list(ds.domains) == list(CATALOG[name].domains)
    assert ds.classes == sorted(FOLDER_CLASSES)
    total = len(FOLDER_CLASSES) * IMAGES_PER_CLASS
    for domain in ds.domains.values():
        assert (len(domain.train), len(domain.val), len(domain.test)) == (12, 3, total)
        assert torch.bincount(domain.val.y).tolist() == [1, 1, 1]  # stratified 0.2 per class
    _labels_match_colours(ds)
    assert "DomainBed holdout" in ds.meta["split"]
    for domain in ds.domains.values():  # train, val and test: rows of one mapped array
        (mapped,) = domain.test.x.sources
        assert domain.train.x.sources == (mapped,) and domain.val.x.sources == (mapped,)
    first = next(iter(ds.domains))
    assert ds.meta["counts"][first] == {"train": 12, "val": 3, "test": total}
    assert check_dataset(name, tmp_path)[0] == ds.meta["counts"]  # check says what a run uses
    again = load_dataset(name, data_root=tmp_path, image_size=8, seed=0)
    other = load_dataset(name, data_root=tmp_path, image_size=8, seed=1)
    vals = [dense(d.domains[first].val.x) for d in (ds, again, other)]
    assert torch.equal(vals[0], vals[1])
    assert not torch.equal(vals[0], vals[2])


def test_office_home_real_world_keeps_its_space(tmp_path):
    _folder_tree("office-home", tmp_path)
    ds = load_dataset("office-home:Art,Real World", data_root=tmp_path, image_size=8)
    assert list(ds.domains) == ["Art", "Real World"]
    assert list(ds.meta["counts"]) == ["Art", "Real World"]  # only these were decoded
    with pytest.raises(DatasetError, match="unknown domain 'Real_World'"):
        load_dataset("office-home:Art,Real_World", data_root=tmp_path, image_size=8)


@pytest.mark.parametrize("name", ["domainnet", "domainnet10"])
def test_domainnet_official_lists_define_splits_and_class_order(name, tmp_path):
    lines = _domainnet_tree(tmp_path)
    ds = load_dataset(name, data_root=tmp_path, image_size=8, seed=3)
    if name == "domainnet":
        assert ds.classes == list(DOMAINNET_CLASSES)
        per_class_train = 4 * len(DOMAINNET_CLASSES)
    else:
        assert ds.classes == list(DOMAINNET10_CLASSES)  # aircraft_carrier is not among them
        per_class_train = 4 * 2
    for domain_name, domain in ds.domains.items():
        test_lines = [
            r for r in lines[domain_name]["test"] if name == "domainnet" or "aircraft" not in r
        ]
        assert len(domain.test) == len(test_lines)
        assert len(domain.train) + len(domain.val) == per_class_train
        assert len(domain.val) > 0
        sizes = {"train": len(domain.train), "val": len(domain.val), "test": len(domain.test)}
        assert check_dataset(name, tmp_path)[0][domain_name] == sizes
    _labels_match_colours(ds)
    assert "official train/test lists" in ds.meta["split"]


def _one_line_error(match: str, name: str, root: Path, **kw) -> None:
    with pytest.raises(DatasetError, match=match) as info:
        load_dataset(name, data_root=root, image_size=8, **kw)
    assert "\n" not in str(info.value)


def test_broken_trees_are_one_line_errors(tmp_path):
    _one_line_error("dataset root .* does not exist", "vlcs", tmp_path / "nowhere")
    _folder_tree("vlcs", tmp_path / "vlcs")
    (tmp_path / "vlcs" / "bird" / "x.jpg").parent.mkdir()
    _one_line_error("missing domain folder .*Caltech101", "vlcs", tmp_path)
    bad = tmp_path / "vlcs" / "SUN09" / "car" / "SUN09_001.jpg"
    bad.write_bytes(b"not a jpeg")
    _one_line_error("unreadable image file .*SUN09_001.jpg", "vlcs", tmp_path / "vlcs")
    _domainnet_tree(tmp_path / "dn")
    (tmp_path / "dn" / "sketch_test.txt").unlink()
    _one_line_error("missing split list .*sketch_test.txt", "domainnet", tmp_path / "dn")
    _one_line_error("needs|data_root", "office31", "")


def test_user_split_files_replace_the_split(tmp_path):
    _folder_tree("office-caltech10", tmp_path / "data")
    lists = tmp_path / "lists"
    lists.mkdir()
    classes = sorted(FOLDER_CLASSES)
    for domain in CATALOG["office-caltech10"].domains:
        rows = [
            f"{domain}/{cls}/{domain}_{i:03d}.jpg {classes.index(cls)}"
            for cls in FOLDER_CLASSES
            for i in range(IMAGES_PER_CLASS)
        ]
        (lists / f"{domain}_train.txt").write_text("\n".join(rows[:9]) + "\n")
        (lists / f"{domain}_test.txt").write_text("\n".join(rows[9:]) + "\n")
        if domain != "dslr":
            (lists / f"{domain}_val.txt").write_text(rows[0] + "\n")
    ds = load_dataset(
        "office-caltech10", data_root=tmp_path / "data", image_size=8, split_files=lists
    )
    amazon, dslr = ds.domains["amazon"], ds.domains["dslr"]
    assert (len(amazon.train), len(amazon.val), len(amazon.test)) == (9, 1, 6)
    assert len(dslr.train) + len(dslr.val) == 9 and len(dslr.val) > 0  # seeded holdout
    _labels_match_colours(ds)
    assert "user split lists" in ds.meta["split"]
    (lists / "webcam_train.txt").write_text("webcam/car/webcam_000.jpg 0\n")  # car is label 2
    _one_line_error(
        "label 0 .* folder 'car'", "office-caltech10", tmp_path / "data", split_files=lists
    )
    _one_line_error("split_files applies to the catalog", "digits-dg", "", split_files=lists)


@pytest.mark.parametrize("name", ["pacs", *FOLDER_DATASETS, "domainnet", "domainnet10"])
def test_one_round_cli_run(name, tmp_path):
    if name == "pacs":
        _pacs_tree(tmp_path / "data")
        target = "sketch"
    elif name.startswith("domainnet"):
        _domainnet_tree(tmp_path / "data")
        target = "sketch"
    else:
        _folder_tree(name, tmp_path / "data")
        target = CATALOG[name].domains[-1]
    out = tmp_path / "run"
    argv = ["run", "-d", name, "-t", target, "--rounds", "1", "--quiet", "--out", str(out)]
    for setting in (f"data_root={tmp_path / 'data'}", "threads=1", "image_size=16", "batch_size=8"):
        argv += ["--set", setting]
    assert main(argv) == 0
    meta = json.loads((out / "config.json").read_text())["run_info"]["dataset_meta"]
    assert target in meta["counts"] and meta["split"]
    assert main([*argv[:-2], "--out", str(tmp_path / "r2"), "--set", "data_root=/nowhere"]) == 2


def test_domainbed_augment_is_seeded_by_the_client_generator_only(tmp_path):
    from fedshift.core.context import SplitView
    from fedshift.core.split import Split
    from fedshift.data.augment import DomainBedAugment

    images = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8)
    augment = DomainBedAugment(16)
    torch.manual_seed(5)
    global_state = torch.get_rng_state()
    first = augment(images, torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), global_state)  # the global RNG is untouched
    assert first.shape == images.shape and first.dtype == torch.uint8
    assert torch.equal(first, augment(images, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, augment(images, torch.Generator().manual_seed(2)))
    assert not torch.equal(first, images)
    view = SplitView(Split(x=images, y=torch.zeros(6, dtype=torch.long)), True, "cpu", augment)
    ((plain, _),) = view.batches(6, shuffle=False)  # evaluation: no generator, no augmentation
    assert torch.equal(plain, images.float() / 127.5 - 1.0)
    ((trained, _),) = view.batches(6, torch.Generator().manual_seed(0), shuffle=False)
    assert not torch.equal(trained, plain)


def _run_inputs(tmp_path, dataset_args, *settings):
    out = tmp_path / "run"
    argv = ["run", *dataset_args, "--rounds", "1", "--quiet", "--out", str(out)]
    for setting in ("threads=1", *settings):
        argv += ["--set", setting]
    assert main(argv) == 0
    info = json.loads((out / "config.json").read_text())["run_info"]
    metrics = (out / "metrics.jsonl").read_text()
    return info["inputs"], metrics


def test_augment_defaults_domainbed_for_the_catalog_and_none_for_digits(tmp_path):
    _folder_tree("vlcs", tmp_path / "data")
    common = (f"data_root={tmp_path / 'data'}", "image_size=16", "batch_size=8")
    vlcs = ["-d", "vlcs", "-t", "VOC2007"]
    inputs, seeded = _run_inputs(tmp_path / "a", vlcs, *common)
    assert inputs == {"augment": "domainbed", "normalize": "symmetric", "augment_backend": "pil"}
    _, again = _run_inputs(tmp_path / "b", vlcs, *common)
    assert _accuracies(seeded) == _accuracies(again)  # augmented runs stay reproducible
    inputs, unaugmented = _run_inputs(tmp_path / "c", vlcs, *common, "augment=none")
    assert inputs["augment"] == "none"
    loss = _accuracies(seeded)[0]["train_loss"]
    assert loss != _accuracies(unaugmented)[0]["train_loss"]  # the batches were augmented
    digits = [
        "-d",
        "digits-dg:mnist,optdigits",
        "-t",
        "optdigits",
        "--set",
        "client_data_fraction=0.05",
    ]
    inputs, _ = _run_inputs(tmp_path / "d", digits)
    assert inputs["augment"] == "none"


def _accuracies(metrics: str) -> list:
    return [
        {k: v for k, v in json.loads(line).items() if "acc" in k or "loss" in k}
        for line in metrics.splitlines()
    ]


def test_imagenet_normalization_for_torchvision_weights(tmp_path):
    from fedshift.models import build_model
    from fedshift.models.base import IMAGENET_MEAN, IMAGENET_STD

    plain = build_model("resnet18", 3, image_size=16)
    assert plain.input_normalization == "symmetric"
    torchvision_state = {
        ("fc." + k[5:] if k.startswith("head.") else k[9:]): v
        for k, v in plain.state_dict().items()
    }
    path = tmp_path / "resnet18.pt"
    torch.save(torchvision_state, path)
    pretrained = build_model("resnet18", 3, image_size=16, weights_path=path, normalize="auto")
    pretrained.eval()
    assert pretrained.input_normalization == "imagenet"
    assert list(pretrained.state_dict()) == list(plain.state_dict())
    x = torch.rand(2, 3, 16, 16) * 2 - 1
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    plain.eval()
    expected = plain.features(((x + 1) / 2 - mean) / std)
    assert torch.allclose(pretrained.features(x), expected, atol=1e-5)
    kept = build_model("resnet18", 3, image_size=16, weights_path=path)
    assert kept.input_normalization == "symmetric"  # the library default: as before
    with pytest.raises(ValueError, match="3 input channels"):
        build_model("cnn", 3, in_channels=1, normalize="imagenet")


def _mix(spec) -> dict[str, int]:
    return {name: len(train) for name, train, _, _ in spec.mixed if len(train)}


def test_heterogeneity_partition_mixes_domains_by_lambda(tmp_path):
    from fedshift.data import partition_domains

    _folder_tree("vlcs", tmp_path)
    ds = load_dataset("vlcs", data_root=tmp_path, image_size=8)
    sources = ["Caltech101", "LabelMe", "SUN09"]

    def clients(lam, per_domain=2, seed=0):
        return partition_domains(
            ds,
            sources,
            clients_per_domain=per_domain,
            scheme="heterogeneity",
            heterogeneity_lambda=lam,
            seed=seed,
        )

    pure = clients(0.0)
    assert len(pure) == 6 and all(len(_mix(c)) == 1 for c in pure)
    assert [c.domain for c in pure] == [d for d in sources for _ in range(2)]
    even = clients(1.0, per_domain=1)
    assert all(_mix(c) == {d: 4 for d in sources} for c in even)  # 12 train images / 3 clients
    for lam in (0.0, 0.5, 1.0):
        specs = clients(lam)
        for split in (1, 2, 3):  # every sample of every split goes to exactly one client
            for d in sources:
                held = np.concatenate([p[split] for c in specs for p in c.mixed if p[0] == d])
                size = len(ds.domains[d].split(("train", "val", "test")[split - 1]))
                assert sorted(held.tolist()) == list(range(size))
    half = clients(0.5)
    assert all(len(_mix(c)) == 3 and max(_mix(c).values()) > 2 for c in half)
    assert [c.mixed[0][1].tolist() for c in half] == [c.mixed[0][1].tolist() for c in clients(0.5)]
    with pytest.raises(DatasetError, match="without train samples"):
        clients(0.0, per_domain=13)


def test_heterogeneity_partition_run(tmp_path):
    _folder_tree("vlcs", tmp_path / "data")
    out = tmp_path / "run"
    argv = ["run", "-d", "vlcs", "-t", "VOC2007", "--rounds", "1", "--quiet", "--out", str(out)]
    argv += ["--partition", "heterogeneity", "--clients-per-domain", "2"]
    for setting in (f"data_root={tmp_path / 'data'}", "threads=1", "image_size=16", "lambda=0.5"):
        argv += ["--set", setting]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["heterogeneity_lambda"] == 0.5
    clients = config["run_info"]["clients"]
    assert len(clients) == 6 and sum(c["train"] for c in clients) == 3 * 12
    assert main([*argv[:-2], "--set", "lambda=2"]) == 2


def _same_pixels(a, b) -> None:
    assert list(a.domains) == list(b.domains)
    for name, domain in a.domains.items():
        for split in ("train", "val", "test"):
            left, right = domain.split(split), b.domains[name].split(split)
            assert torch.equal(dense(left.x), dense(right.x)) and torch.equal(left.y, right.y)


def test_image_cache_maps_the_eagerly_decoded_pixels(tmp_path, image_cache, monkeypatch):
    from fedshift.data import lists
    from fedshift.data.catalog import load_catalog

    _folder_tree("vlcs", tmp_path / "data")
    eager = load_catalog("vlcs", tmp_path / "data", image_size=8, cache=False)
    assert set(eager.meta["image_cache"].values()) == {""}
    first = load_dataset("vlcs", data_root=tmp_path / "data", image_size=8)
    _same_pixels(first, eager)
    files = sorted(image_cache.glob("*.npy"))
    assert len(files) == 4 and len(list(image_cache.glob("*.json"))) == 4
    assert sorted(first.meta["image_cache"].values()) == [str(f) for f in files]

    def no_decoding(path, size):
        raise AssertionError(f"decoded {path} although it is cached")

    monkeypatch.setattr(lists, "read_image", no_decoding)
    second = load_dataset("vlcs", data_root=tmp_path / "data", image_size=8)
    _same_pixels(second, eager)
    with pytest.raises(TypeError):  # the mapped rows are read-only: the file never changes
        second.domains["SUN09"].train.x[0] += 1
    _same_pixels(load_dataset("vlcs", data_root=tmp_path / "data", image_size=8), eager)
    with pytest.raises(AssertionError, match="decoded"):  # a new seed is a new row order
        load_dataset("vlcs", data_root=tmp_path / "data", image_size=8, seed=1)


def test_corrupt_or_unwritable_image_cache_is_rebuilt_with_a_warning(tmp_path, image_cache):
    from fedshift.data.catalog import load_catalog

    _folder_tree("office-caltech10", tmp_path / "data")
    eager = load_catalog("office-caltech10", tmp_path / "data", image_size=8, cache=False)
    files = load_dataset("office-caltech10", data_root=tmp_path / "data", image_size=8).meta
    dslr = Path(files["image_cache"]["dslr"])
    amazon = Path(files["image_cache"]["amazon"])
    data = bytearray(dslr.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dslr.write_bytes(bytes(data))
    amazon.write_bytes(amazon.read_bytes()[:-10])
    with pytest.warns(RuntimeWarning, match="image cache .* unusable") as caught:
        rebuilt = load_dataset("office-caltech10", data_root=tmp_path / "data", image_size=8)
    assert {"checksum mismatch" in str(w.message) for w in caught} == {True, False}
    _same_pixels(rebuilt, eager)
    assert dslr.read_bytes() != bytes(data)  # the file was replaced
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    with pytest.warns(RuntimeWarning, match="could not write the image cache"):
        in_memory = load_dataset(
            "office-caltech10", data_root=tmp_path / "data", image_size=8, cache_dir=blocked
        )
    _same_pixels(in_memory, eager)
    assert set(in_memory.meta["image_cache"].values()) == {""}


def test_catalog_split_full_is_refused_where_it_would_change_nothing(tmp_path, digits_cache):
    """#47: ``catalog_split=full`` on digits-dg (or any entry that does not sample its
    official files down) was accepted and ignored; now one line naming where it applies."""
    expected = "catalog_split=full applies to the catalog entries whose protocol samples"
    with pytest.raises(DatasetError, match=expected + r".*\(digit-five\), not to 'digits-dg'"):
        load_dataset("digits-dg", cache_dir=digits_cache, catalog_split="full")
    with pytest.raises(DatasetError, match=r"\(digit-five\), not to 'pacs'"):
        load_dataset("pacs", data_root=tmp_path / "none", catalog_split="full")
    assert [name for name, entry in CATALOG.items() if entry.samples_down] == ["digit-five"]
    assert load_dataset("digits-dg", cache_dir=digits_cache, catalog_split="default").domains
