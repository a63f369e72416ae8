"""``torch.load`` of the files fedshift reads (checkpoints, model weights), guarded.

Only ``weights_only=True`` (tensors and plain containers; nothing else is unpickled), with
torch's own warnings kept off the user's terminal (a raw pickle makes torch warn about its
protocol before it refuses the file, so the user would see two torch lines before
fedshift's one), and a failure described in one plain line: torch's refusal is several
sentences with ANSI bold escapes and advice to load with ``weights_only=False``, which
fedshift never does.
"""

from __future__ import annotations

import re
import warnings
from typing import IO, Any

import torch

#: an ANSI escape sequence (CSI ... final byte), e.g. torch's ``\x1b[1m`` bold
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def plain_line(text: str, limit: int = 300) -> str:
    """``text`` as one printable line: ANSI escape sequences and other control characters
    removed, runs of whitespace made one space, cut to ``limit`` characters."""
    text = ANSI.sub("", text)
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_weights_only(source: str | IO[bytes]) -> Any:
    """``torch.load(source, weights_only=True)`` onto the CPU, torch's warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.load(source, map_location="cpu", weights_only=True)


def load_failure(exc: BaseException) -> str:
    """Why :func:`load_weights_only` failed, in one plain line (torch's unpickler refusal
    cut to the object it refused)."""
    text = plain_line(str(exc), limit=100_000)
    if "Weights only load failed" in text:
        if "WeightsUnpickler error:" in text:
            detail = text.split("WeightsUnpickler error:", 1)[1]
        else:
            detail = text.rsplit("trusted source.", 1)[-1]
        detail = detail.split(" Check the documentation", 1)[0].split(" Please use", 1)[0]
        detail = detail.strip().rstrip(".") or "an object outside its safe set"
        return plain_line(f"the safe unpickler refuses it: {detail}")
    return plain_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
