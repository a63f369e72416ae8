"""MeanFold: FedAvg's mean folded in as replies arrive equals the mean of held replies."""

import torch

from fedshift.algorithms.toolkit import MeanFold, average_replies
from fedshift.core.record import Record
from fedshift.core.robust import Aggregator


def replies(n: int = 5) -> dict[int, Record]:
    gen = torch.Generator().manual_seed(1)
    out = {}
    for cid in range(n):
        reply = Record().with_arrays("model", {"w": torch.randn(4, 4, generator=gen)})
        reply.with_arrays("reference", {"r": torch.randn(2, generator=gen)})
        reply.metrics.update({"num-examples": 10 + 7 * cid, "loss": 0.5 * cid})
        out[cid] = reply
    return out


def test_the_folded_mean_is_the_mean_of_the_held_replies_bit_for_bit():
    held = replies()
    expected = average_replies(held, Aggregator())
    fold = MeanFold()
    streamed = replies()
    for cid, reply in streamed.items():
        fold(cid, reply)
    out = fold.result()
    assert out.keys() == expected.keys() == {"w"}
    assert torch.equal(out["w"], expected["w"])


def test_a_folded_reply_lets_go_of_its_model_and_keeps_the_rest():
    fold = MeanFold()
    reply = replies(1)[0]
    fold(0, reply)
    assert list(reply.arrays) == ["reference.r"]
    assert reply.metrics == {"num-examples": 10, "loss": 0.0}
