"""A broken ``.mat`` file in a Digit-Five copy is one line naming the file and what is wrong
with it (not a MATLAB file, truncated), in ``datasets check`` and in a run alike."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from scipy.io import savemat
from test_catalog_digit_five import _tree

from fedshift.cli import main
from fedshift.data import DatasetError, load_dataset
from fedshift.data.formats.mat import HEADER_BYTES, check_mat_file, mat_load, mat_variables

HTML_PAGE = b"<html><body>404 Not Found</body></html>\n"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))


def _one_line_everywhere(root: Path, match: str, capsys) -> None:
    """``datasets check`` exits 2 with one error line, a run raises one DatasetError line."""
    capsys.readouterr()
    assert main(["datasets", "check", "digit-five", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("fedshift: error: ")
    assert re.search(match, errors[0]), errors[0]
    with pytest.raises(DatasetError, match=match) as info:
        load_dataset("digit-five", data_root=root)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("size", [5, 40, 126])
def test_a_small_non_matlab_file_is_not_a_matlab_file(tmp_path, capsys, size):
    root = _tree(tmp_path / "d5")
    (root / "svhn" / "train_32x32.mat").write_bytes((HTML_PAGE * 4)[:size])
    _one_line_everywhere(root, r"svhn/train_32x32\.mat: not a MATLAB file", capsys)


def test_a_mat_file_cut_in_half_is_truncated(tmp_path, capsys):
    root = _tree(tmp_path / "d5")
    path = root / "svhn" / "test_32x32.mat"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    match = rf"test_32x32\.mat: truncated \({len(whole) // 2} of at least \d+ bytes\)"
    _one_line_everywhere(root, match, capsys)


@pytest.mark.parametrize("compressed", [False, True])
def test_every_cut_of_a_real_file_is_one_line(tmp_path, compressed):
    path = tmp_path / "full.mat"
    savemat(
        path,
        {"X": np.arange(60, dtype=np.uint8).reshape(3, 4, 5), "y": np.arange(3)},
        do_compression=compressed,
    )
    whole = path.read_bytes()
    assert set(mat_variables(path, "test")) == {"X", "y"}
    cut = tmp_path / "cut.mat"
    whole_prefixes = []  # cuts exactly where a variable ends: whole files with fewer variables
    for size in range(len(whole)):
        cut.write_bytes(whole[:size])
        try:
            found = list(mat_variables(cut, "test"))
        except DatasetError as exc:
            assert re.search(r"cut\.mat: (not a MATLAB|truncated)", str(exc)), str(exc)
            with pytest.raises(DatasetError, match=r"cut\.mat: (not a MATLAB|truncated)"):
                mat_load(cut, ("X", "y"))
            continue
        whole_prefixes.append(size)
        assert found == ["X", "y"][: len(found)]
    assert len(whole_prefixes) == 2 and whole_prefixes[0] == HEADER_BYTES


def test_other_failures_name_the_file(tmp_path):
    with pytest.raises(DatasetError, match=r"missing file .*absent\.mat \(expected L\)"):
        check_mat_file(tmp_path / "absent.mat", "L")
    hdf5 = tmp_path / "v73.mat"
    header = b"MATLAB 7.3 MAT-file, HDF5 schema 1.00 .".ljust(124) + b"\x00\x02IM"
    hdf5.write_bytes(header + b"\x89HDF\r\n\x1a\n" + bytes(400))
    with pytest.raises(DatasetError, match=r"v73\.mat: a MATLAB 7\.3 \(HDF5\) file"):
        mat_load(hdf5, ("X",))
    path = tmp_path / "full.mat"
    savemat(path, {"X": np.zeros((2, 2)), "y": np.arange(3)})
    broken = bytearray(path.read_bytes())
    broken[128:136] = bytes(8)  # the first variable's tag zeroed
    path.write_bytes(bytes(broken))
    with pytest.raises(DatasetError, match=r"full\.mat: corrupt \(no variable starts at byte 128"):
        mat_variables(path, "test")
