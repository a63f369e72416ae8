"""What the FedProto comparison scripts share (``fedproto_official_draw.py``,
``fedproto_official_eval.py``, ``fedproto_official_partition.py``): the official MNIST draw of
ways and shots, scoring a finished run's client models as the official code does, and the
official running-ratio formula of the published figure. Imports no benchmark script, so no
benchmark imports another; numpy only at import (``--write-order`` runs under any numpy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

#: the official README's MNIST command: 20 clients, 100 shots, stdev 2; MNIST's 10 classes
CLIENTS, SHOTS, STDEV, CLASSES = 20, 100, 2, 10


def official_lists(ways: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The official ``n_list`` and ``k_list`` (MNIST rule) for ``ways``: the first two draws
    after ``np.random.seed(seed)`` in ``exps/federated_main.py``, in client order."""
    rng = np.random.RandomState(seed)  # the state np.random.seed(seed) gives
    n_list = rng.randint(max(2, ways - STDEV), min(CLASSES, ways + STDEV + 1), CLIENTS)
    k_list = rng.randint(SHOTS - STDEV + 1, SHOTS + STDEV - 1, CLIENTS)
    return n_list, k_list


def score_clients(
    checkpoint: dict,
    model_keys: tuple[str, str, bool],
    num_classes: int,
    clients: list[tuple[int, torch.Tensor, torch.Tensor]],
) -> list[tuple[int, int, int]]:
    """(head correct, prototype correct, test images) of each ``(client id, uint8 images,
    labels)``: the client's final model from ``checkpoint`` (built from ``model_keys``: the run
    keys ``model`` and ``normalize``, and whether ``input_channels`` is 1), its head over all
    classes, and the nearest global prototype among its own classes (the official MSE
    distance)."""
    import torch

    from fedshift.models import build_model, normalize_input

    model_name, normalize, gray_input = model_keys
    table = {int(c): v for c, v in checkpoint["server"]["extra"]["prototypes"].items()}
    counts = []
    for client_id, images, y in clients:
        state = checkpoint["clients"][str(client_id)]
        model = build_model(
            model_name, num_classes, in_channels=images.shape[1],
            image_size=images.shape[-1], normalize=normalize, gray_input=gray_input,
        )  # fmt: skip
        model.load_state_dict(state["model"])
        model.eval()
        own = [int(c) for c in state["classes"].tolist()]
        x = normalize_input(images)
        with torch.no_grad():
            features = model.features(x)
            head = model.classifier(features).argmax(1)
        distance = torch.full((len(y), num_classes), 100.0)  # the official 'large'
        for c in own:
            if c in table:
                distance[:, c] = ((features - table[c]) ** 2).mean(1)  # MSELoss per sample
        proto = distance.argmin(1)
        counts.append((int((head == y).sum()), int((proto == y).sum()), len(y)))
    return counts


def official_running_ratios(counts: list[tuple[int, int, int]]) -> list[float]:
    """The accuracies the official code appends, in %: for client i, the ratio of correct to
    scored over clients 0..i, its head pass and its prototype pass pooled (never reset)."""
    correct = total = 0
    running = []
    for head, proto, tests in counts:
        correct += head + proto
        total += 2 * tests  # the head pass, then the prototype pass (acc_list_g)
        running.append(100 * correct / total)
    return running
