"""The real dataset copies of the ``real`` tier: each fixture is the copy's root under
``$FEDSHIFT_REAL_DATA`` (``.ci/run`` points it at ``../shared/datasets``), or a skip that
says what is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def real_copy(folder: str, inside: str) -> Path:
    """``$FEDSHIFT_REAL_DATA/folder``, which must hold ``inside``; else the test is skipped."""
    base = os.environ.get("FEDSHIFT_REAL_DATA")
    if not base:
        pytest.skip(f"real tier: set FEDSHIFT_REAL_DATA to a folder holding {folder}/")
    root = Path(base) / folder
    if not (root / inside).is_dir():
        pytest.skip(f"real tier: no {folder} copy ({folder}/{inside}/) under {base}")
    return root


@pytest.fixture(scope="module")
def pacs_root() -> Path:
    return real_copy("PACS", "kfold")


@pytest.fixture(scope="module")
def mnist_root() -> Path:
    """The Digit-Five root holding (at least) the official MNIST files in ``mnist/``."""
    return real_copy("digit-five", "mnist")
