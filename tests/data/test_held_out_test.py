"""A domain that trains and is scored holds out its test images: FPL's official rule (image
``i`` of the domain, in its whole-domain test order, when ``i % 10 > 7``), taken out of the
default train / val split, for the catalog entries whose test split is the whole domain."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_catalog_loaders import FOLDER_CLASSES, IMAGES_PER_CLASS, _folder_tree, _jpeg

from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import CATALOG, FOLDER_DATASETS
from fedshift.data.catalog.base import split_off_test
from fedshift.scenarios import build_scenario

WHOLE_DOMAIN_TEST = {"pacs", "camelyon17", "fundus", "prostate", *FOLDER_DATASETS}


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "fedshift-cache"))
    return tmp_path / "fedshift-cache"


def test_the_rule_is_fpls_last_two_of_every_ten():
    rest, test = split_off_test(list(range(25)))
    assert test == [8, 9, 18, 19]
    assert rest == [i for i in range(25) if i % 10 <= 7]  # ImageFolder_Custom's train rule
    assert split_off_test(list(range(8))) == (list(range(8)), [])


def test_the_catalog_cards_say_which_entries_test_on_the_whole_domain():
    assert {n for n, e in CATALOG.items() if e.whole_domain_test} == WHOLE_DOMAIN_TEST
    for name in WHOLE_DOMAIN_TEST - {"fundus", "prostate"}:
        assert "i % 10 > 7" in CATALOG[name].split, name


def test_a_held_out_load_takes_the_test_images_out_of_the_default_split(tmp_path):
    _folder_tree("office-caltech10", tmp_path)
    whole = load_dataset("office-caltech10", data_root=tmp_path, image_size=8)
    held = load_dataset("office-caltech10", data_root=tmp_path, image_size=8, held_out_test=True)
    total = len(FOLDER_CLASSES) * IMAGES_PER_CLASS  # 15: images 8 and 9 are test images
    assert whole.meta["test_is_domain"] and not held.meta["test_is_domain"]
    assert "FPL's official rule" in held.meta["split"]
    for name, domain in held.domains.items():
        assert len(domain.test) == 2
        assert len(domain.train) + len(domain.val) + len(domain.test) == total
        default = whole.domain(name)
        assert len(default.test) == total
        # the other images keep their default split: the held-out 2 left train or val
        assert len(default.train) - len(domain.train) + len(default.val) - len(domain.val) == 2
        # ImageFolder order: sorted classes (Alarm_Clock, bird, car), so images 8 and 9 are
        # bird's 4th and 5th
        assert domain.test.y.tolist() == [1, 1]


def test_per_domain_and_personalized_refuse_a_whole_domain_test(tmp_path):
    _folder_tree("office-home", tmp_path)
    whole = load_dataset("office-home", data_root=tmp_path, image_size=8)
    for protocol in ("per-domain", "personalized"):
        cfg = resolve(None, {"dataset": "office-home", "protocol": protocol}, [])
        with pytest.raises(ConfigError, match="held_out_test=True"):
            build_scenario(cfg, whole, pooled=False)
    lodo = resolve(None, {"dataset": "office-home", "target": "Art"}, [])
    assert build_scenario(lodo, whole, pooled=False).targets == ["Art"]


def test_a_domain_too_small_to_hold_out_a_test_image_is_one_line(tmp_path):
    for i in range(8):
        _jpeg(tmp_path / "amazon" / "back_pack" / f"{i}.jpg", "back_pack", i)
    with pytest.raises(DatasetError, match=r"office-caltech10/amazon has 8 images, too few"):
        load_dataset(
            "office-caltech10:amazon", data_root=tmp_path, image_size=8, held_out_test=True
        )
