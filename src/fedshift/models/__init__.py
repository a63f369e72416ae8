"""Backbones with an explicit ``features()`` / ``classifier()`` split.

Every model is a :class:`FedModel`: ``features(x) -> (N, embed_dim)``,
``classifier(f) -> (N, num_classes)``; parameters live under ``backbone.`` and ``head.``.
Build one with :func:`build_model`; the names are the keys of :data:`MODELS`.
"""

from .base import FedModel, normalize_input
from .registry import DEFAULT_MODEL, MODELS, build_model, register_model
from .weights import load_weights

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "FedModel",
    "build_model",
    "load_weights",
    "normalize_input",
    "register_model",
]
