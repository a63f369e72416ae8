"""Files a user was sent never import code, and every file reader is bounded.

A preset, a ``--config`` file or a saved ``config.json`` naming an import path
(``package.module:name``) for ``algorithm`` or ``model`` is refused with one line naming
the key and the file and how to allow it; the command line, the Python API and the opt-in
(``--allow-imports``, ``FEDSHIFT_ALLOW_IMPORTS=1``) may. ``python -m fedshift.cli`` does
not import a module lying in the working directory. Deep JSON, an import path naming no
model builder and an unsupported figure suffix are one-line errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fedshift
from fedshift.cli import main
from fedshift.config import ALLOW_IMPORTS_ENV, resolve, resolve_resume
from fedshift.core.errors import CheckpointError, ConfigError
from fedshift.core.runfiles import RunFiles, read_summary
from fedshift.models import build_model
from fedshift.plugins import is_import_path
from fedshift.presets import load_preset, preset_names

#: a module that leaves a marker file behind when it is imported
EVIL_MODULE = """
from pathlib import Path
Path(__file__).with_name("MARKER").write_text("imported")
X = 1
"""
#: JSON nested far deeper than any reader allows (and than Python's recursion limit)
DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.fixture(autouse=True)
def no_opt_in(monkeypatch):
    monkeypatch.delenv(ALLOW_IMPORTS_ENV, raising=False)


def write_evil_preset(folder: Path, key: str = "algorithm") -> Path:
    (folder / "evilmod.py").write_text(EVIL_MODULE)
    preset = folder / "p.toml"
    preset.write_text(f'{key} = "evilmod:X"\nrounds = 1\n')
    return preset


def run_module_cli(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    """``python -m fedshift.cli ARGV`` in ``folder``, fedshift found through PYTHONPATH."""
    source = str(Path(fedshift.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": source}
    env.pop(ALLOW_IMPORTS_ENV, None)
    command = [sys.executable, "-m", "fedshift.cli", *argv]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)


def test_module_cli_never_imports_a_module_beside_the_preset(tmp_path):
    write_evil_preset(tmp_path)
    refused = run_module_cli(tmp_path, "run", "--preset", "./p.toml", "--dry-run")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "algorithm='evilmod:X'" in lines[0] and "p.toml" in lines[0]
    assert "--allow-imports" in lines[0] and ALLOW_IMPORTS_ENV in lines[0]
    allowed = run_module_cli(tmp_path, "run", "--config", "p.toml", "--allow-imports", "--dry-run")
    assert allowed.returncode == 2, allowed.stderr
    assert "cannot import 'evilmod'" in allowed.stderr  # the working directory is not searched
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("key", ["algorithm", "model"])
def test_config_file_import_path_is_refused(tmp_path, key):
    config = write_evil_preset(tmp_path, key)
    with pytest.raises(ConfigError, match=f"config file {config} sets {key}='evilmod:X'"):
        resolve(str(config), {}, [])
    with pytest.raises(ConfigError, match=f"preset file {config} sets {key}='evilmod:X'"):
        resolve(None, {"preset": str(config)}, [])
    assert not (tmp_path / "MARKER").exists()


def test_command_line_overrides_a_file_import_path(tmp_path):
    config = write_evil_preset(tmp_path, "model")
    cfg = resolve(str(config), {"model": "cnn"}, [])
    assert cfg.model == "cnn"
    with pytest.raises(ConfigError, match="cannot import 'nosuchmodule_fedshift'"):
        resolve(None, {}, ["algorithm=nosuchmodule_fedshift:X"])


def test_opt_in_lets_a_file_name_an_import_path(tmp_path, monkeypatch):
    config = tmp_path / "c.toml"
    config.write_text('algorithm = "nosuchmodule_fedshift:X"\n')
    with pytest.raises(ConfigError, match="cannot import 'nosuchmodule_fedshift'"):
        resolve(str(config), {}, [], allow_imports=True)
    monkeypatch.setenv(ALLOW_IMPORTS_ENV, "1")
    with pytest.raises(ConfigError, match="cannot import 'nosuchmodule_fedshift'"):
        resolve(str(config), {}, [])


def test_resume_needs_a_saved_import_path_again(tmp_path):
    saved = {"algorithm": "nosuchmodule_fedshift:X", "rounds": 1}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match="saved config of the run in .* algorithm="):
        resolve_resume(tmp_path, None, {}, [])
    with pytest.raises(ConfigError, match="cannot import 'nosuchmodule_fedshift'"):
        resolve_resume(tmp_path, None, {"algorithm": "nosuchmodule_fedshift:X"}, [])
    with pytest.raises(ConfigError, match="cannot import 'nosuchmodule_fedshift'"):
        resolve_resume(tmp_path, None, {}, [], allow_imports=True)


def test_shipped_presets_name_no_import_path():
    for name in preset_names():
        values = load_preset(name).settings.values()
        assert not [v for v in values if isinstance(v, str) and is_import_path(v)], name


def test_deep_json_in_a_run_directory_is_one_error(tmp_path):
    (tmp_path / "config.json").write_text(DEEP_JSON)
    (tmp_path / "summary.json").write_text(DEEP_JSON)
    with pytest.raises(CheckpointError, match="cannot resume: no checkpoint.pt"):
        RunFiles(tmp_path).saved_config()
    assert read_summary(tmp_path) is None


def test_report_on_deep_summary_is_one_line(tmp_path, capsys):
    (tmp_path / "summary.json").write_text(DEEP_JSON)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "fedshift: error: no summary.json" in err


def test_report_plot_with_an_unknown_suffix_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--plot", str(tmp_path / "x.pt")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot write a figure as '.pt'" in lines[0], lines


def test_import_path_naming_no_model_builder():
    with pytest.raises(ValueError, match="'os:getcwd': 'getcwd' is not a model builder"):
        build_model("os:getcwd", 10)
