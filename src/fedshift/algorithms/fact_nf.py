"""FACT-NF: FACT without the source fine-tuning step (Schrod et al., 2023)."""

from __future__ import annotations

from fedshift.algorithms.fact import FACT


class FACTNoFinetune(FACT):
    """FACT without step (3): the target receives the heads exactly as the two sources
    trained them, so G' is never sent back down to the sources. Each round then costs one
    generator transfer less per source (the paper's communication-restricted variant);
    the sources send G and F together after training. Everything else — cross-initialized
    source training, unweighted generator averaging, IDD minimization on the target w.r.t.
    G, head averaging, min-IDD model selection, the official optimizer and schedule — is
    FACT's; see :class:`~fedshift.algorithms.fact.FACT` for the deviation notes.
    """

    name = "fact-nf"
    paper = FACT.paper + " (FACT-NF: no fine-tuning)"
    finetune = False
