"""The in-process engine: clients run in this process (``dispatch``), many at once where they
can be batched (``vectorized``), and tampering with what clients send (``tampering``: the
injected faults and the simulated attacks)."""
