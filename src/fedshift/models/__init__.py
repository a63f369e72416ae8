"""Backbones with an explicit ``features()`` / ``classifier()`` split.

Every model is a :class:`FedModel`: ``features(x) -> (N, embed_dim)``,
``classifier(f) -> (N, num_classes)``; parameters live under ``backbone.`` and ``head.``.
Build one with :func:`build_model`; the names are the keys of :data:`MODELS`. Each backbone
is a :class:`ModelCard` (``cards.py``); its pinned weights come from a weight source
(``sources.py``) and are read by ``weights.py``.
"""

from .base import FedModel, normalize_input
from .cards import ModelCard
from .registry import DEFAULT_MODEL, MODELS, build_model, register_model
from .sources import PinnedWeights, WeightSource, register_weight_source
from .weights import load_weights

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "FedModel",
    "ModelCard",
    "PinnedWeights",
    "WeightSource",
    "build_model",
    "load_weights",
    "normalize_input",
    "register_model",
    "register_weight_source",
]
