"""fedshift's private transport under the Flower engine: the resident per-SuperNode worker
(``resident``: the ClientApp's side, ``worker``: the long-running process), its framed wire
format (``wire``), the node's decoded-dataset cache (``node_cache``) and its client-state
snapshots (``node_state``). The Flower app (``serverapp``, ``clientapp``, ``federation``)
uses it; nothing here is Flower's API."""
