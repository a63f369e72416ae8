"""t-SNE of client features with the global prototypes marked (BD-FedProto, seed 002 fig. 3).

The task is rebuilt from the run's ``config.json`` (same seed, same partition) and the models
come from its ``checkpoint.pt``: each client's own model for personal methods (FedProto,
local), the global model otherwise. A seeded sample of every client's test share is embedded
with ``features()``; points are coloured by class and marked by client. Global prototypes
(the server's ``prototypes`` table, e.g. FedProto's) are drawn as large squares; a run
without one gets the per-class means of the plotted features instead, labelled as such.
With ``with_target`` the held-out target domain's test split is embedded too (with the
global model, as it is evaluated), marked by stars, to show how far it lies from the
sources' features.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from fedshift.config import rebuild_config
from fedshift.core.bounded import read_json_bounded
from fedshift.core.errors import ConfigError
from fedshift.core.outputs import FIGURE, check_output, write_figure
from fedshift.core.runfiles import CONFIG, RunFiles
from fedshift.core.seeding import torch_generator
from fedshift.core.split import to_input
from fedshift.core.state import ServerState, load_checkpoint
from fedshift.engine.assembly import personal_model, prepare

CLIENT_MARKERS = ("o", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p", "d")


@dataclasses.dataclass
class Embedding:
    """Features of sampled points and the prototypes to mark, before t-SNE."""

    features: np.ndarray  # (N, dim)
    labels: np.ndarray  # (N,)
    clients: np.ndarray  # (N,) index into ``client_names``
    client_names: list[str]
    prototypes: np.ndarray  # (P, dim)
    prototype_labels: np.ndarray  # (P,)
    prototypes_are_global: bool
    title: str
    #: how many of the last ``client_names`` are held-out target domains (not clients)
    targets: int = 0


def load_run(run_dir: str | Path, cache_dir: str | None = None, *, allow_imports: bool = False):
    """The experiment of a run directory with its checkpointed server and client states.
    A saved import path is refused as on ``--resume`` unless ``allow_imports``
    (:func:`fedshift.config.rebuild_config`)."""

    files = RunFiles(run_dir)
    if not files.config.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no {CONFIG})")
    if not isinstance(read_json_bounded(files.config, ConfigError), dict):
        raise ConfigError(f"{files.config} is not a fedshift run config")
    cfg = rebuild_config(run_dir, allow_imports=allow_imports)
    exp = prepare(cfg, cache_dir=cache_dir)
    ckpt = load_checkpoint(files.checkpoint)
    for cid, ctx in exp.contexts.items():
        ctx.state = dict(ckpt["clients"].get(str(cid), {}))
    return exp, ServerState.from_dict(ckpt["server"]), int(ckpt["round"])


@torch.no_grad()
def collect(
    exp, state: ServerState, per_client: int = 100, seed: int = 0, with_target: bool = False
) -> Embedding:
    """Features of up to ``per_client`` test samples of every client (and, ``with_target``,
    of each held-out target domain), and the prototypes."""

    algo = exp.algorithm
    shared = None if algo.personal else algo.global_model(state)
    feats, labels, owners, names = [], [], [], []
    for index, client in enumerate(exp.scenario.clients):
        ctx = exp.contexts[client.client_id]
        model = personal_model(algo, ctx) if algo.personal else shared
        if model is None:
            continue
        split = client.test if len(client.test) else client.train
        gen = torch_generator(seed, "tsne", client.client_id)
        idx = torch.randperm(len(split), generator=gen)[:per_client]
        model.to(exp.device).eval()
        f = model.features(to_input(split.x[idx], exp.device)).to("cpu", torch.float32)
        feats.append(f)
        labels.append(split.y[idx])
        owners.append(torch.full((len(idx),), index))
        names.append(client.name)
    if not feats:
        raise ConfigError("the checkpoint holds no model to embed features with")
    clients_plotted = sum(len(f) for f in feats)  # class means come from these only
    targets = target_domains(exp) if with_target else []
    if targets:
        model = algo.global_model(state)
        if model is None:
            raise ConfigError(
                f"--with-target: {algo.name} keeps no global model to embed the target with"
            )
        model.to(exp.device).eval()
        for domain in targets:
            split = exp.scenario.dataset.domains[domain].test
            gen = torch_generator(seed, "tsne-target", domain)
            idx = torch.randperm(len(split), generator=gen)[:per_client]
            f = model.features(to_input(split.x[idx], exp.device)).to("cpu", torch.float32)
            feats.append(f)
            labels.append(split.y[idx])
            owners.append(torch.full((len(idx),), len(names)))
            names.append(f"{domain} (target)")
    features = torch.cat(feats)
    label_arr = torch.cat(labels)
    table = state.extra.get("prototypes") or {}
    if table:
        classes = sorted(int(c) for c in table)
        protos = torch.stack([table[str(c)].float() for c in classes])
        from_server = True
    else:
        source_features, source_labels = features[:clients_plotted], label_arr[:clients_plotted]
        classes = sorted(torch.unique(source_labels).tolist())
        protos = torch.stack([source_features[source_labels == c].mean(0) for c in classes])
        from_server = False
    cfg = exp.cfg
    return Embedding(
        features=features.numpy(),
        labels=label_arr.numpy(),
        clients=torch.cat(owners).numpy(),
        client_names=names,
        prototypes=protos.numpy(),
        prototype_labels=np.asarray(classes),
        prototypes_are_global=from_server,
        title=f"{cfg.algorithm} on {cfg.dataset} ({cfg.protocol})",
        targets=len(targets),
    )


def target_domains(exp) -> list[str]:
    """The held-out target domains: target domains that no client trains on."""
    trained = {client.domain for client in exp.scenario.clients}
    held_out = [d for d in exp.scenario.targets if d not in trained]
    if not held_out:
        raise ConfigError(
            f"--with-target: the {exp.cfg.protocol} run has no held-out target domain "
            "(its targets are clients' own domains, already plotted)"
        )
    return held_out


def embed_2d(embedding: Embedding, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """t-SNE coordinates of the points and of the prototypes (embedded together)."""
    from sklearn.manifold import TSNE

    stacked = np.concatenate([embedding.features, embedding.prototypes]).astype(np.float64)
    perplexity = float(min(30.0, max(2.0, (len(stacked) - 1) / 3)))
    coords = TSNE(
        n_components=2, perplexity=perplexity, init="pca", random_state=seed
    ).fit_transform(stacked)
    n = len(embedding.features)
    return coords[:n], coords[n:]


def plot_tsne(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    per_client: int = 100,
    seed: int = 0,
    cache_dir: str | None = None,
    with_target: bool = False,
    force: bool = False,
    allow_imports: bool = False,
) -> Path:
    """Write the t-SNE figure of a run (default ``RUN_DIR/tsne.png``) under the output rule
    of :mod:`fedshift.core.outputs` (``force`` replaces a file fedshift did not write);
    returns its path. ``with_target`` adds the held-out target domain's test features
    (stars); ``allow_imports`` lets the run's config.json name an import path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(out) if out else Path(run_dir) / "tsne.png"
    check_output(path, FIGURE, "--out", force=force)
    exp, state, round_ = load_run(run_dir, cache_dir, allow_imports=allow_imports)
    embedding = collect(exp, state, per_client=per_client, seed=seed, with_target=with_target)
    points, protos = embed_2d(embedding, seed)
    colours = plt.get_cmap("tab10" if exp.dataset.num_classes <= 10 else "tab20")
    fig, ax = plt.subplots(figsize=(8, 7))
    first_target = len(embedding.client_names) - embedding.targets
    for index, name in enumerate(embedding.client_names):
        rows = embedding.clients == index
        is_target = index >= first_target
        ax.scatter(
            points[rows, 0],
            points[rows, 1],
            c=[colours(int(c) % colours.N) for c in embedding.labels[rows]],
            marker="*" if is_target else CLIENT_MARKERS[index % len(CLIENT_MARKERS)],
            s=40 if is_target else 14,
            alpha=0.6,
            linewidths=0,
            label=name if is_target or len(embedding.client_names) <= 12 else None,
        )
    proto_name = "global prototype" if embedding.prototypes_are_global else "class mean"
    ax.scatter(
        protos[:, 0],
        protos[:, 1],
        c=[colours(int(c) % colours.N) for c in embedding.prototype_labels],
        marker="s",
        s=160,
        edgecolors="black",
        linewidths=1.5,
    )
    ax.scatter([], [], marker="s", s=160, c="white", edgecolors="black", label=proto_name)
    for (x, y), c in zip(protos, embedding.prototype_labels, strict=True):
        ax.annotate(exp.dataset.classes[int(c)], (x, y), ha="center", va="center", fontsize=7)
    marker_means = "client or target" if embedding.targets else "client"
    ax.set_title(f"{embedding.title}, round {round_}: colour = class, marker = {marker_means}")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.legend(loc="best", fontsize=7, markerscale=1.0, framealpha=0.8)
    fig.tight_layout()
    try:
        return write_figure(fig, path, "--out", force=force, dpi=120)
    finally:
        plt.close(fig)
