"""Every weight file is read under one guard: a path that is no regular file says what it is
(without blocking on a FIFO), a corrupt file of any format and complex-valued tensors are one
ModelError line, whatever the source (a user's file, timm's Hugging Face cache, CCST's VGG)."""

from __future__ import annotations

import os
import threading
import warnings

import pytest
import torch

from fedshift.core.errors import ModelError
from fedshift.models import build_model, load_weights
from fedshift.models.adain import load_adain_networks
from fedshift.models.weights import read_state_file, weights_file


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_folder_is_named_a_folder(tmp_path):
    with pytest.raises(ModelError, match="is a folder, not a file") as info:
        load_weights(build_model("cnn", 3), tmp_path)
    _one_line(info)
    with pytest.raises(ModelError, match="is a folder, not a file"):
        weights_file("cnn", tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "weights.pth"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def read() -> None:
        try:
            read_state_file(fifo)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            caught.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO with no writer blocked"
    assert len(caught) == 1 and isinstance(caught[0], ModelError)
    assert "is a FIFO (named pipe), not a file" in str(caught[0])
    with pytest.raises(ModelError, match="is a FIFO"):
        weights_file("cnn", fifo)


def test_dev_zero_is_a_character_device():
    with pytest.raises(ModelError, match="'/dev/zero' is a character device, not a file"):
        read_state_file("/dev/zero")
    with pytest.raises(ModelError, match="is a character device"):
        weights_file("cnn", "/dev/zero")


def test_a_missing_file_is_not_found(tmp_path):
    with pytest.raises(ModelError, match="weights file not found"):
        read_state_file(tmp_path / "absent.pth")


def test_complex_weights_are_refused_in_one_line_without_a_torch_warning(tmp_path):
    model = build_model("cnn", 3)
    state = {
        k: v.to(torch.complex64) if v.is_floating_point() else v
        for k, v in model.state_dict().items()
    }
    path = tmp_path / "complex.pth"
    torch.save(state, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ModelError, match="holds complex-valued tensors") as info:
            load_weights(build_model("cnn", 3), path)
    assert "backbone." in _one_line(info) and "in all)" in str(info.value)
    assert caught == []


def test_a_corrupt_safetensors_file_is_one_line(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ModelError, match="could not read weights file .*safetensors") as info:
        read_state_file(path)
    _one_line(info)


def test_a_safetensors_file_loads_as_a_state_dict(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(3)
    model = build_model("cnn", 3)
    path = tmp_path / "cnn.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    torch.manual_seed(4)
    other = load_weights(build_model("cnn", 3), path)
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key
    assert other.weights_layout == "fedshift" and other.weights_normalization is None


def test_a_corrupt_file_in_the_hugging_face_cache_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("timm", reason="needs the 'pretrained' extra (timm)")
    import huggingface_hub

    corrupt = tmp_path / "model.safetensors"
    corrupt.write_bytes(b"\xff" * 64)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: str(corrupt))
    with pytest.raises(ModelError, match="could not read weights file") as info:
        build_model("timm:resnet18", 5, weights_path="imagenet")
    assert str(corrupt) in _one_line(info)


def test_a_corrupt_vgg_file_of_ccst_is_one_line(tmp_path):
    vgg, decoder = tmp_path / "vgg.pth", tmp_path / "decoder.pth"
    vgg.write_bytes(b"not a torch file")
    decoder.write_bytes(b"")
    with pytest.raises(ModelError, match="^VGG: could not read weights file") as info:
        load_adain_networks(vgg, decoder)
    _one_line(info)
    with pytest.raises(ModelError, match="^VGG: weights file .* is a folder"):
        load_adain_networks(tmp_path, decoder)
