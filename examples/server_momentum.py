"""Change the server step: FedAvg with server momentum (a small FedAvgM) as your own method.

    python examples/server_momentum.py [--smoke]

The clients train exactly as in FedAvg; only ``round`` changes. The server keeps its momentum
buffer in ``state.extra`` (tensors there are checkpointed with the model, so ``--resume``
continues the same momentum), and steps only floating tensors: BatchNorm's integer
``num_batches_tracked`` counters keep FedAvg's rounded mean. The built-in ``fedavgm`` is the
full version (checked against Flower's FedAvgM).
"""

import argparse
import tempfile
from dataclasses import dataclass

import torch

import fedshift
from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.hparams import BaseHparams, hp


@dataclass(frozen=True)
class MomentumHparams(BaseHparams):
    beta: float = hp(0.9, "β", "server momentum", low=0, high=1, high_open=True)


class ServerMomentum(FedAvg):
    """FedAvg's round, then ``v ← β·v + (x − mean)`` and ``x ← x − v`` on floating tensors."""

    name = "server-momentum"
    paper = "example: server momentum (Hsu et al., 2019)"
    Hparams = MomentumHparams

    def round(self, state, fed):
        before = state.model
        state, metrics = super().round(state, fed)  # state.model is now FedAvg's mean
        if state.model is before:  # nobody replied: keep model and momentum
            return state, metrics
        velocity = state.extra.setdefault("velocity", {})  # server state: checkpointed
        new = dict(state.model)
        for name, old in before.items():
            if not old.is_floating_point():
                continue  # an integer buffer (BatchNorm counter): keep FedAvg's mean
            step = old - state.model[name]
            velocity[name] = self.hp.beta * velocity.get(name, torch.zeros_like(old)) + step
            new[name] = old - velocity[name]
        state.model = new
        return state, metrics


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="tiny settings (seconds, for CI)")
parser.add_argument("--out", default=None, help="folder for the run (default: a new temp folder)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fedshift-example-")
size = {"rounds": 2, "client_data_fraction": 0.1, "threads": 1} if args.smoke else {"rounds": 10}

fedshift.register_algorithm(ServerMomentum)
result = fedshift.run(
    algorithm="server-momentum", algo={"beta": 0.9}, device="cpu", out=f"{out}/momentum", **size
)
print(f"server-momentum (β=0.9): target accuracy {result.summary['target_accuracy']:.3f}")
