"""Names shared by the ServerApp and the ClientApp (kept free of heavy imports).

The identity query is answered from the node config alone, so a ClientApp process that
only says which client it serves never imports torch or loads data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: engine task asking a SuperNode which client it serves
IDENTIFY = "fedshift.identify"
#: engine task asking a client to score its personal model where it lives
EVALUATE = "fedshift.evaluate"
#: engine notice telling a SuperNode that its identity was refused, and why
REFUSED = "fedshift.refused"
#: ConfigRecord of an identity reply
IDENTITY = "identity"
#: message type of the algorithm's client tasks and of the engine's identity query
TASK_MESSAGE_TYPE = "train"
QUERY_MESSAGE_TYPE = "query"
#: ConfigRecord with engine instructions (task, client, round, call index, run token)
CONTROL = "fedshift"

IDENTITY_KEYS = ("client-id", "partition-id", "num-partitions")


def identity_of(node_config: Mapping[str, Any]) -> dict[str, Any]:
    """What a SuperNode says about itself: the identity keys of its node config."""
    return {k: node_config[k] for k in IDENTITY_KEYS if k in node_config}


def control_of(content: Mapping[str, Any]) -> dict[str, Any]:
    """The engine instructions of a message's content (empty when there are none)."""
    return dict(content[CONTROL]) if CONTROL in content else {}
