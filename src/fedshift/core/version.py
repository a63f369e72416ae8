"""fedshift's version, recorded in every run directory."""

__version__ = "0.1.0"
