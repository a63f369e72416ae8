"""Backbones with an explicit ``features()`` / ``classifier()`` split.

Every model is a :class:`FedModel`: ``features(x) -> (N, embed_dim)``,
``classifier(f) -> (N, num_classes)``; parameters live under ``backbone.`` and ``head.``.
Build one with :func:`build_model`; the names are the keys of :data:`MODELS`. Each backbone
is a :class:`ModelCard` (``cards.py``); its pinned weights come from a weight source
(``sources.py``) and are read by ``weights.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import FedModel, normalize_input
    from .cards import ModelCard
    from .registry import DEFAULT_MODEL, MODELS, build_model, register_model
    from .sources import PinnedWeights, WeightSource, register_weight_source
    from .weights import load_weights

#: public name -> the module of ``fedshift.models`` that defines it (imported on first use:
#: naming and listing models loads no torch)
_HOMES = {
    "DEFAULT_MODEL": "registry",
    "MODELS": "registry",
    "FedModel": "base",
    "ModelCard": "cards",
    "PinnedWeights": "sources",
    "WeightSource": "sources",
    "build_model": "registry",
    "load_weights": "weights",
    "normalize_input": "base",
    "register_model": "registry",
    "register_weight_source": "sources",
}

__all__ = [
    "DEFAULT_MODEL",
    "FedModel",
    "MODELS",
    "ModelCard",
    "PinnedWeights",
    "WeightSource",
    "build_model",
    "load_weights",
    "normalize_input",
    "register_model",
    "register_weight_source",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"fedshift.models.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'fedshift.models' has no attribute {name!r}")
