"""Visual check of a :class:`DomainDataset`: one row of samples per domain, saved as a figure."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fedshift.core.outputs import FIGURE, check_output, write_figure
from fedshift.data.domains import DatasetError, DomainDataset, Split


def _pick(split: Split, per_domain: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of up to ``per_domain`` samples: one per class first, then random others."""
    y = split.y.numpy()
    chosen: list[int] = []
    for c in np.unique(y):
        if len(chosen) >= per_domain:
            break
        chosen.append(int(rng.choice(np.flatnonzero(y == c))))
    rest = np.setdiff1d(np.arange(len(y)), np.asarray(chosen, dtype=np.int64))
    extra = per_domain - len(chosen)
    if extra > 0 and rest.size:
        chosen.extend(int(i) for i in rng.choice(rest, size=min(extra, rest.size), replace=False))
    return np.asarray(chosen, dtype=np.int64)


def save_sample_grid(
    dataset: DomainDataset,
    path: str | os.PathLike,
    per_domain: int = 10,
    split: str = "train",
    *,
    force: bool = False,
) -> Path:
    """Save a grid with one row per domain (labelled) and ``per_domain`` samples per row, in
    the figure format ``path``'s suffix names, under the output rule of
    :mod:`fedshift.core.outputs` (``force`` replaces a file fedshift did not write)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if per_domain < 1:
        raise DatasetError(f"per_domain must be >= 1, got {per_domain}")
    check_output(path, FIGURE, "--out", force=force)
    if split not in ("train", "val", "test"):
        raise DatasetError(f"unknown split {split!r}; expected one of: train, val, test")
    names = dataset.domain_names
    if not names:
        raise DatasetError(f"dataset {dataset.name!r} has no domains to preview")

    rng = np.random.default_rng(0)
    rows, cols = len(names), per_domain
    fig = Figure(figsize=(1.1 * cols + 1.2, 1.15 * rows + 0.4), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for r, name in enumerate(names):
        part: Split = getattr(dataset.domain(name), split)
        idx = _pick(part, per_domain, rng) if len(part) else np.zeros(0, dtype=np.int64)
        for c in range(cols):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
            if c < len(idx):
                img = part.x[int(idx[c])].numpy()
                label = dataset.classes[int(part.y[int(idx[c])])]
                if img.shape[0] == 1:
                    ax.imshow(img[0], cmap="gray", vmin=0, vmax=255, interpolation="nearest")
                else:
                    ax.imshow(img.transpose(1, 2, 0), interpolation="nearest")
                ax.set_title(label, fontsize=8, pad=2)
            if c == 0:
                ax.set_ylabel(name, fontsize=10, rotation=0, ha="right", va="center")
    fig.suptitle(f"{dataset.name} ({split})", fontsize=11)
    fig.tight_layout()
    return write_figure(fig, path, "--out", force=force)
