"""The names of the server's aggregation rules (``RunConfig.aggregator``), apart from
:mod:`fedshift.core.robust` that implements them (and imports torch), so the run keys' help
lists them without torch, as :mod:`fedshift.engine.fault_names` names the faults."""

from __future__ import annotations

#: every aggregation rule :mod:`fedshift.core.robust` implements, in the order help lists them
AGGREGATORS: tuple[str, ...] = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "bulyan")
