"""The errors fedshift raises on bad input, one type per kind of input.

Each message names what was expected; the command line turns them into one line and exit
code 2. They live at the bottom layer so every module can raise them without importing
the layers above.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the valid choices."""


class DatasetError(ValueError):
    """A dataset could not be loaded, built or partitioned; the message says what was expected."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupt or belongs to another run."""


class RoundFailed(RuntimeError):
    """Too few clients replied for the failure policy."""
