"""Every reader of a file fedshift reads, fed random and adversarial bytes (deep nesting,
huge numbers, truncations, NUL bytes, invalid UTF-8), raises only its one error type.

Readers: the run directory's JSON (config.json, summary.json, metrics.jsonl), a TOML
``--config`` file, a preset, a dataset's JSON file, a ``.mat`` file, a split list, a
checkpoint, a Flower array's ``.npy`` header, the caches' sidecars and ``.npy`` files (the
image cache, digits-dg, the Flower node cache's manifest, stamp and arrays), a pretrained
backbone's sidecar, the Flower run token in ``config.json``, the resident worker's secret and
a ClientApp's stored state tree.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshift.config import read_toml
from fedshift.core.errors import CheckpointError, ConfigError, DatasetError
from fedshift.core.runfiles import RunFiles, load_json_object, read_json_file, read_summary
from fedshift.core.state import load_checkpoint
from fedshift.data import digits, image_cache
from fedshift.data.formats.jsonfile import read_json
from fedshift.data.formats.mat import mat_load, mat_variables
from fedshift.data.lists import read_split_list
from fedshift.presets import load_preset
from fedshift.pretrain import read_sidecar

#: the reason a Flower reader's test is skipped where the ``flower`` extra is not installed
FLWR_MISSING = "flwr is not installed; pip install -e '.[flower]'"


#: the modules of fedshift's private Flower transport (``engine/flower/transport/``)
TRANSPORT = {"node_cache", "node_state", "resident", "wire", "worker"}


def flower_module(name: str):
    """``fedshift.engine.flower[.transport].NAME`` (which imports flwr), or the test skipped
    without flwr."""
    pytest.importorskip("flwr", reason=FLWR_MISSING)
    package = "fedshift.engine.flower.transport" if name in TRANSPORT else "fedshift.engine.flower"
    return importlib.import_module(f"{package}.{name}")


FUZZ = settings(max_examples=50, deadline=None)

#: hand-made hostile inputs every reader gets among the random ones
ADVERSARIAL = [
    b"",
    b"\x00" * 64,
    b"[" * 50_000 + b"]" * 50_000,
    b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    b"[" * 65 + b"]" * 65,
    b"x = " + b"[" * 5_000 + b"]" * 5_000,
    b"x = " + b"{a=" * 2_000 + b"1" + b"}" * 2_000,
    b"a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z." * 10 + b"end = 1",
    b'{"algorithm": ' + b"9" * 10_000 + b"}",
    b"rounds = " + b"9" * 10_000,
    b"lr = 1e99999",
    b'{"x": 1e99999, "y": NaN}',
    b'{"algorithm": "fed\x00avg"}',
    b'algorithm = "fed\x00avg"',
    b"\xff\xfe\x00\x00garbage",
    b'{"algorithm": "fedavg", "target": "mnistm", "seed": 0',
    b"MATLAB 5.0 MAT-file" + b" " * 105 + b"\x00\x01IM" + b"\x0e\x00\x00\x00\xff\xff\xff\x7f",
    b"MATLAB 5.0 MAT-file" + b" " * 105 + b"\x00\x01IM" + b"\x0f\x00\x00\x00\x08\x00\x00\x00",
    b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (9999999999,), }",
    b"\x93NUMPY\x01\x00\x10\x00" + b"(" * 16,
    b"PK\x03\x04" + b"\x00" * 100,
    b"d1/c0/a.png " + b"9" * 10_000,
    b"d1/c0/\x00.png 0\n",
    b"../../etc/passwd 0\n",
]
#: well-formed documents whose truncations and mutations are fed too
VALID = [
    b'{"algorithm": "fedavg", "target": "mnistm", "seed": 0, "algo": {"mu": [1, 2]}}',
    b'algorithm = "fedavg"\nrounds = 2\n[algo]\n',
    b"d1/c0/a.png 0\nd1/c1/b.png 1\n",
]


@st.composite
def hostile_bytes(draw) -> bytes:
    """Random bytes, an adversarial input, or a cut or poked well-formed document."""
    kind = draw(st.sampled_from(["random", "adversarial", "truncated", "poked"]))
    if kind == "random":
        return draw(st.binary(max_size=2_000))
    if kind == "adversarial":
        return draw(st.sampled_from(ADVERSARIAL))
    valid = draw(st.sampled_from(VALID + ADVERSARIAL[-8:]))
    cut = draw(st.integers(0, len(valid)))
    if kind == "truncated":
        return valid[:cut]
    poke = draw(st.binary(min_size=1, max_size=8))
    return valid[:cut] + poke + valid[cut:]


def only_raises(
    error: type[Exception] | tuple[()], read: Callable[[Path], object], name: str, data: bytes
) -> None:
    """``read`` of a file holding ``data`` returns or raises ``error`` (``()``: never raises)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            read(path)
        except error:
            pass


@FUZZ
@given(hostile_bytes())
def test_run_directory_json(data):
    only_raises(CheckpointError, load_json_object, "config.json", data)
    only_raises(CheckpointError, lambda p: RunFiles(p.parent).saved_config(), "config.json", data)
    for reader in (read_json_file, read_summary):  # a warning and None, never an error
        only_raises((), reader, "summary.json", data)
    only_raises((), lambda p: RunFiles(p.parent).history(), "metrics.jsonl", data)


@FUZZ
@given(hostile_bytes())
def test_toml_config_file(data):
    only_raises(ConfigError, read_toml, "config.toml", data)


@FUZZ
@given(hostile_bytes())
def test_preset_file(data):
    only_raises(ConfigError, load_preset, "preset.toml", data)


@FUZZ
@given(hostile_bytes())
def test_dataset_json_file(data):
    only_raises(DatasetError, read_json, "annotations.json", data)


@FUZZ
@given(hostile_bytes())
def test_mat_file(data):
    only_raises(DatasetError, lambda p: mat_variables(p, "a .mat file"), "x.mat", data)
    only_raises(DatasetError, lambda p: mat_load(p, ["X"]), "x.mat", data)


@FUZZ
@given(hostile_bytes())
def test_split_list(data):
    def read(path: Path) -> object:
        return read_split_list(path, path.parent, ["c0", "c1"])

    only_raises(DatasetError, read, "train.txt", data)


@FUZZ
@given(hostile_bytes())
def test_checkpoint(data):
    only_raises(CheckpointError, lambda p: load_checkpoint(p, fallback=False), "c.pt", data)


@FUZZ
@given(hostile_bytes())
def test_npy_header(data):
    wire = flower_module("wire")
    try:
        wire.npy_layout(data)
    except wire.ProtocolError:
        pass


@pytest.mark.parametrize("depth, deep", [(64, False), (65, True)])
def test_json_depth_bound(tmp_path, depth, deep):
    path = tmp_path / "config.json"
    path.write_text('{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}")
    if deep:
        with pytest.raises(CheckpointError, match="nests deeper than 64 levels"):
            load_json_object(path)
    else:
        nested: list = []
        for _ in range(depth - 2):
            nested = [nested]
        assert load_json_object(path) == {"a": nested}


def test_checkpoint_size_bound(tmp_path, monkeypatch):
    from fedshift.core import state

    monkeypatch.setattr(state, "MAX_CHECKPOINT_BYTES", 16)
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"\x00" * 17)
    with pytest.raises(CheckpointError, match="above the 16-byte bound"):
        load_checkpoint(path, fallback=False)


def test_toml_size_bound(tmp_path):
    path = tmp_path / "config.toml"
    path.write_bytes(b"# padding\n" * ((1 << 20) // 10 + 1))
    with pytest.raises(ConfigError, match="larger than the 1,048,576-byte bound"):
        read_toml(path)


def _quiet(read: Callable[[Path], object]) -> Callable[[Path], object]:
    """``read`` with its warnings (a cache's "unusable, rebuilding") silenced."""

    def quiet(path: Path) -> object:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return read(path)

    return quiet


def _image_cache_sidecar(path: Path) -> object:
    data = path.with_suffix(".npy")
    np.save(data, np.zeros((1, 3, 2, 2), dtype=np.uint8))
    return image_cache.open_cached(data, path, (1, 3, 2, 2))


def _image_cache_data(path: Path) -> object:
    """A hostile ``.npy`` whose sidecar matches it (so it reaches ``np.load``)."""
    sidecar = path.with_suffix(".json")
    info = {"version": image_cache.CACHE_VERSION, "shape": [1, 3, 2, 2]}
    info |= {"bytes": path.stat().st_size, "sha256_sampled": image_cache.sampled_digest(path)}
    sidecar.write_text(json.dumps(info))
    return image_cache.open_cached(path, sidecar, (1, 3, 2, 2))


@FUZZ
@given(hostile_bytes())
def test_image_cache_files(data):  # a bad file means: decode again (a warning, never an error)
    only_raises((), _quiet(_image_cache_sidecar), "x.json", data)
    only_raises((), _quiet(_image_cache_data), "x.npy", data)


@FUZZ
@given(hostile_bytes())
def test_digits_cache_sidecar(data):  # a bad sidecar means: rebuild (a warning)
    def read(path: Path) -> object:
        npz = path.with_suffix(".npz")
        npz.write_bytes(b"PK\x05\x06" + bytes(18))
        return digits._try_load_cache(npz, path)

    only_raises((), _quiet(read), "digits-dg-v1.json", data)


def _manifest(files: dict[str, str]) -> dict:
    head = {
        "layout": flower_module("node_cache").LAYOUT,
        "name": "d",
        "domains": ["a"],
        "classes": ["c"],
    }
    return head | {"channels": 1, "image_size": 2, "meta": {}, "files": files}


@FUZZ
@given(hostile_bytes())
def test_flower_node_cache(data):  # a bad cache means: rebuild it
    node_cache = flower_module("node_cache")
    invalid = node_cache.CacheInvalid
    only_raises(invalid, lambda p: node_cache.open_cache(p.parent), node_cache.MANIFEST, data)

    def stamp(path: Path) -> object:
        manifest = _manifest({}) | {"domains": []}
        (path.parent / node_cache.MANIFEST).write_text(json.dumps(manifest))
        return node_cache.open_cache(path.parent)

    only_raises((), stamp, node_cache.STAMP, data)

    def array(path: Path) -> object:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        manifest = _manifest({path.name: digest, "0-train-y.npy": digest})
        (path.parent / "0-train-y.npy").write_bytes(path.read_bytes())
        (path.parent / node_cache.MANIFEST).write_text(json.dumps(manifest))
        return node_cache.open_cache(path.parent)

    only_raises(node_cache.CacheInvalid, array, "0-train-x.npy", data)


def test_flower_node_cache_refuses_paths_outside_it(tmp_path):
    node_cache = flower_module("node_cache")
    (tmp_path / "cache").mkdir()
    manifest = _manifest({"../secret.npy": "0" * 64})
    (tmp_path / "cache" / node_cache.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(node_cache.CacheInvalid, match="files are not"):
        node_cache.open_cache(tmp_path / "cache")


@FUZZ
@given(hostile_bytes())
def test_pretrained_backbone_sidecar(data):
    only_raises(ConfigError, lambda p: read_sidecar(p.with_suffix("")), "backbone.pt.json", data)


@FUZZ
@given(hostile_bytes())
def test_flower_run_token(data):
    run_token = flower_module("serverapp").run_token
    options = flower_module("settings").DeployOptions

    def read(path: Path) -> object:
        return run_token(options(out_dir=str(path.parent), resume=True))

    only_raises(CheckpointError, read, "config.json", data)


@FUZZ
@given(hostile_bytes())
def test_worker_secret(data):
    resident = flower_module("resident")
    only_raises(resident.WorkerUnavailable, resident.read_secret, "worker.secret", data)


@FUZZ
@given(hostile_bytes())
def test_flower_stored_client_state(data):
    """A ClientApp's ``ctx.state`` tree as Flower stored it (Context.state), decoded bounded."""
    flower_module("convert")
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from fedshift.engine.flower.convert import STATE_ARRAYS, STATE_TREE, ConversionError, load_state

    def read(path: Path) -> object:
        text = path.read_bytes().decode("utf-8", errors="replace")
        source = RecordDict({STATE_TREE: ConfigRecord({"tree": text}), STATE_ARRAYS: ArrayRecord()})
        return load_state(source)

    only_raises(ConversionError, read, "state.json", data)
