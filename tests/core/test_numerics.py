"""The pinned CPU numeric path: set at import, honoured by torch's three CPU libraries,
recorded by every run, refused where it cannot hold (one line)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fedshift.core import numerics
from fedshift.core.errors import ConfigError
from fedshift.engine.compute import resolve_precision

needs_avx2 = pytest.mark.skipif(
    not torch.cpu._is_avx2_supported(), reason="the pinned path is AVX2: this CPU lacks it"
)


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the pinning variables cleared, ``env`` set."""
    base = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENV}
    base.pop(numerics.ENV_MODE, None)
    return subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True
    )


@needs_avx2
def test_import_pins_every_library_before_torch_computes():
    done = python(
        "import fedshift, os, torch\n"
        "names = ('ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA', 'MKL_CBWR')\n"
        "print([os.environ[k] for k in names])\n"
        "print(torch.backends.cpu.get_cpu_capability())\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['avx2', 'AVX2', 'COMPATIBLE']", "AVX2"]


@needs_avx2
def test_mkl_and_onednn_take_the_pinned_branch():
    """MKL's verbose line names its CNR branch, oneDNN's the ISA it dispatches to: both are
    what pinned asks (on an AMD CPU a named MKL branch such as AVX2 would print CNR:AUTO)."""
    done = python(
        "import fedshift, torch\n"
        "a = torch.randn(32, 32); a @ a\n"
        "torch.nn.functional.conv2d(torch.randn(16, 3, 12, 12), torch.randn(4, 3, 3, 3))\n",
        MKL_VERBOSE="1",
        ONEDNN_VERBOSE="1",
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "CNR:COMPATIBLE" in out
    assert "isa:Intel AVX2" in out or "isa:AVX2" in out


def test_native_mode_leaves_the_variables_alone():
    done = python(
        "import fedshift, os\nprint(os.environ.get('ATEN_CPU_CAPABILITY'))\n",
        FEDSHIFT_CPU_NUMERICS="native",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_native_run_restores_a_users_own_variable():
    done = python(
        "import fedshift, os\n"
        "from fedshift.core import numerics\n"
        "numerics.set_environment('native')\n"
        "print(os.environ.get('ATEN_CPU_CAPABILITY'), os.environ.get('MKL_CBWR'))\n",
        ATEN_CPU_CAPABILITY="default",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "default None"


@needs_avx2
def test_torch_computing_first_on_another_path_is_one_line():
    """A program that computed with torch before fedshift pinned the path cannot switch:
    the run stops with one line that says why and how."""
    done = python(
        "import torch\n"
        "torch.ones(2) + 1\n"
        "from fedshift.core import numerics\n"
        "try:\n"
        "    numerics.apply('pinned')\n"
        "except numerics.NumericPathError as exc:\n"
        "    print(exc)\n",
        ATEN_CPU_CAPABILITY="default",
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert "\n" not in line
    assert "already computes on the native CPU path (ATen capability DEFAULT" in line
    assert "import fedshift before computing with torch" in line


@needs_avx2
def test_apply_records_the_path_in_force():
    done = python(
        "import fedshift, json\n"
        "from fedshift.core import numerics\n"
        "print(json.dumps(numerics.apply('pinned')))\n"
    )
    assert done.returncode == 0, done.stderr
    info = __import__("json").loads(done.stdout)
    assert info["cpu_numerics"] == "pinned"
    assert info["aten_cpu_capability"] == "AVX2"
    assert (info["onednn_max_cpu_isa"], info["mkl_cbwr"]) == ("AVX2", "COMPATIBLE")
    assert info["cpu_kind"] in ("avx2", "avx512", "avx512-bf16")
    assert info["torch_imported_first"] is False


def test_fast_math_is_refused_on_the_pinned_path(monkeypatch):
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    assert "lowers float32 matmul precision" in numerics.fast_math_problem()


def test_half_precision_on_the_cpu_needs_the_native_path():
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match="add --set cpu_numerics=native"):
        resolve_precision("bf16", cpu, "pinned")
    assert resolve_precision("bf16", cpu, "native").name == "bf16"
    assert resolve_precision("auto", cpu, "pinned").name == "fp32"


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="cpu_numerics must be one of pinned, native"):
        numerics.set_environment("fast")


def test_a_run_records_and_prints_its_numeric_path(tmp_path, tiny_digits):
    from helpers import run

    summary, runner = run(tmp_path, "r", tiny_digits, "fedavg", rounds=1)
    info = runner.exp.info["numerics"]
    assert info["cpu_numerics"] == "pinned"
    assert numerics.summary_line(info).startswith("numeric path pinned (ATen ")


def test_a_run_from_before_the_key_resumes_on_the_native_path(tmp_path):
    """A config.json without ``cpu_numerics`` ran on the native path: it resumes there, and
    a resume cannot switch a run's path (its numbers would change mid-run)."""
    import json

    from fedshift.config import resolve, resolve_resume

    saved = resolve(None, {"algorithm": "fedavg"}, ["rounds=2", "device=cpu"]).to_dict()
    del saved["cpu_numerics"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert resolve_resume(tmp_path, None, {}, []).cpu_numerics == "native"
    saved["cpu_numerics"] = "pinned"
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match="cpu_numerics"):
        resolve_resume(tmp_path, None, {}, ["cpu_numerics=native"])


@needs_avx2
def test_native_promises_nothing_and_records_the_path_in_force():
    """A native run in a process whose torch already computes on another path goes on there
    and records that path: native pins nothing, so there is nothing to refuse."""
    done = python(
        "import torch, json\n"
        "torch.ones(2) + 1\n"
        "from fedshift.core import numerics\n"
        "print(json.dumps(numerics.apply('native')))\n",
        ATEN_CPU_CAPABILITY="default",
    )
    assert done.returncode == 0, done.stderr
    info = __import__("json").loads(done.stdout)
    assert (info["cpu_numerics"], info["aten_cpu_capability"]) == ("native", "DEFAULT")
