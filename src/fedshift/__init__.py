"""fedshift: federated learning under domain shift."""

from fedshift.core.version import __version__

__all__ = ["__version__"]
