"""Flower deployment engine: fedshift's server programs and client tasks on Flower 1.41.

``serverapp.app`` and ``clientapp.app`` are the Flower App components (see
``deploy/flower/pyproject.toml``); ``FlowerFederation`` maps ``fed.call`` to Message-API
exchanges; ``convert`` turns records and client state into ``RecordDict`` without pickle;
``resident`` and ``worker`` keep one long-running process per SuperNode that runs the tasks
the per-message ClientApp forwards to it over ``wire``, a checked local socket protocol.
Import this package only when Flower is used: ``flwr`` is the optional ``[flower]`` extra.
"""
