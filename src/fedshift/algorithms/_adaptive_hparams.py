"""The hyperparameters of FedAdagrad, FedAdam and FedYogi (Reddi et al., ICLR 2021)."""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.core.hparams import BaseHparams, hp, log_uniform


@dataclass(frozen=True)
class AdaptiveHparams(BaseHparams):
    server_lr: float = hp(
        0.1,
        "η",
        "server learning rate (the paper tunes it per task on a grid 10^-3..10^1; 0.1 is "
        "Flower's default)",
        low=0,
        low_open=True,
        search=log_uniform(1e-3, 1.0),
    )
    beta1: float = hp(0.9, "β1", "first-moment (momentum) decay; the paper uses 0.9", low=0, high=1)
    tau: float = hp(
        1e-3,
        "τ",
        "adaptivity: added to √v in the denominator; the paper's default 1e-3",
        low=0,
        low_open=True,
        search=log_uniform(1e-5, 1e-1),
    )


@dataclass(frozen=True)
class DecayingHparams(AdaptiveHparams):
    """FedAdam's and FedYogi's: the second moment decays with β2."""

    beta2: float = hp(0.99, "β2", "second-moment decay; the paper uses 0.99", low=0, high=1)
