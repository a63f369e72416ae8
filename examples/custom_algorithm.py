"""Bring your own algorithm: subclass a built-in one, declare its hyperparameters, register it.

    python examples/custom_algorithm.py [--smoke]

FedProxHead is FedAvg whose local loss pulls only the classifier head towards the global
one: mu/2 * ||head - global head||^2 (a sketch of a personalization-flavoured FedProx).
"""

import argparse
import tempfile
from dataclasses import dataclass

import torch

import fedshift
from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.errors import ConfigError
from fedshift.core.hparams import BaseHparams, hp


@dataclass(frozen=True)
class FedProxHeadHparams(BaseHparams):
    # default, paper symbol, meaning and range: a bad value is a ConfigError, as built-ins
    mu: float = hp(0.1, "μ", "weight of the pull of the head towards the global head", low=0)


class FedProxHead(FedAvg):
    """FedAvg plus mu/2 * ||head - global head||^2 in each client's local loss."""

    name = "fedprox-head"
    paper = "example: FedProx (Li et al., MLSys 2020) on the classifier head only"
    Hparams = FedProxHeadHparams

    def local_penalty(self, ctx, record):
        sent = record.subset("model")  # the global model the server sent, by parameter name
        anchor = {k: v.to(ctx.device) for k, v in sent.items() if k.startswith("head.")}
        mu = self.hp.mu

        def penalty(model):
            terms = [
                (p - anchor[n]).pow(2).sum() for n, p in model.named_parameters() if n in anchor
            ]
            return 0.5 * mu * torch.stack(terms).sum()

        return penalty


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="tiny settings (seconds, for CI)")
parser.add_argument("--out", default=None, help="folder for the run (default: a new temp folder)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fedshift-example-")
size = {"rounds": 1, "client_data_fraction": 0.1, "threads": 1} if args.smoke else {"rounds": 10}

fedshift.register_algorithm(FedProxHead)
result = fedshift.run(
    algorithm="fedprox-head", algo={"mu": 0.5}, device="cpu", out=f"{out}/fedprox-head", **size
)
print(f"fedprox-head (mu=0.5): target accuracy {result.summary['target_accuracy']:.3f}")
try:
    fedshift.run(algorithm="fedprox-head", algo={"mu": -1})
except ConfigError as error:
    print(f"ConfigError: {error}")
