"""A weights file or checkpoint that is a pickle is refused in one plain line: no ANSI
escape from torch's refusal, no torch warning printed before fedshift's error."""

from __future__ import annotations

import fractions
import os
import pickle
import warnings

import pytest
import torch

from fedshift.cli import main
from fedshift.core.errors import CheckpointError
from fedshift.core.state import CHECKPOINT_FORMAT, load_checkpoint
from fedshift.core.torchload import plain_line


def _raw_pickle(path) -> None:
    """A raw pickle (protocol 4): torch warns about its protocol, then refuses it."""
    with open(path, "wb") as handle:
        pickle.dump({"w": os.system}, handle, protocol=4)


def _unsafe_global(path) -> None:
    """A torch.save file holding an object outside torch's safe set (torch's refusal of
    it carries an ANSI bold escape)."""
    torch.save({"format": CHECKPOINT_FORMAT, "w": fractions.Fraction(1, 3)}, path)


@pytest.mark.parametrize("write", [_raw_pickle, _unsafe_global])
def test_pickled_model_weights_give_one_plain_line(in_tmp, capsys, write):
    write(in_tmp / "weights.pt")
    argv = ["run", "--rounds", "1", "--quiet", "--set", "threads=1"]
    argv += ["--set", f"model_weights={in_tmp / 'weights.pt'}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert [str(w.message) for w in caught] == []  # torch's pickle-protocol warning
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "\x1b" not in err and lines[0].isprintable(), repr(err)
    assert "could not read weights file" in lines[0]
    assert "the safe unpickler refuses it" in lines[0]
    assert "weights_only` set to `False`" not in lines[0]  # torch's unsafe advice


@pytest.mark.parametrize("write", [_raw_pickle, _unsafe_global])
def test_pickled_checkpoint_error_is_plain(tmp_path, write):
    path = tmp_path / "checkpoint.pt"
    write(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(path, fallback=False)
    message = str(info.value)
    assert "\x1b" not in message and message.isprintable(), repr(message)
    assert "corrupt or not a fedshift checkpoint" in message
    if write is _unsafe_global:
        assert "fractions.Fraction" in message
    assert [str(w.message) for w in caught] == []


def test_plain_line():
    assert plain_line("a \x1b[1mbold\x1b[0m\nnext\tline\x00") == "a bold next line"
    assert plain_line("x" * 400, limit=10) == "xxxxxxx..."
