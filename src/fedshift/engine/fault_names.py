"""The one fault vocabulary of both engines: the names of injected reply faults.

The simulation engine's ``faults`` run key (:mod:`fedshift.engine.simulation.faults`) and
Flower's tampering ClientApp (:mod:`fedshift.engine.flower.faults`) say the same fault with
the same name; each engine adds the faults only it can inject. Names used before the two
vocabularies were merged are refused with a pointer to the current name.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedshift.core.errors import did_you_mean

#: every floating array of the reply is NaN
NAN = "nan"
#: every array of the reply is int8 zeros
INT8 = "int8"
#: the first array of the reply has the wrong shape
WRONG_SHAPE = "wrong-shape"
#: the first array of the reply is missing
KEY_MISSING = "key-missing"
#: the reply carries an array under a key the algorithm never declared
KEY_EXTRA = "key-extra"
#: ``num-examples`` claims an absurd number of samples (the aggregation weight)
NUM_EXAMPLES_HUGE = "num-examples-huge"
#: ``num-examples`` is a string
NUM_EXAMPLES_STRING = "num-examples-string"

#: old name -> current name (the simulation's and Flower's spellings before the merge)
RENAMED = {
    "shape": WRONG_SHAPE,
    "keys-missing": KEY_MISSING,
    "keys-extra": KEY_EXTRA,
    "weight": NUM_EXAMPLES_HUGE,
    "metric-string": NUM_EXAMPLES_STRING,
    "nan-weights": NAN,
    "int8-zeros": INT8,
    "model-key-missing": KEY_MISSING,
    "model-key-extra": KEY_EXTRA,
}


def unknown_fault(name: str, known: Iterable[str]) -> str:
    """The message for a fault name the engine does not know (a renamed one names its new
    name)."""
    known = tuple(known)
    if name in RENAMED and RENAMED[name] in known:
        return f"fault {name!r} is now called {RENAMED[name]!r}"
    return f"unknown fault {name!r}{did_you_mean(name, known)}; known: {', '.join(known)}"
