"""The delegate under tflite-runtime 2.14, the predecessor of ai-edge-litert that apps still ship:
a venv of its own (it needs numpy < 2), prepared once and cached, runs fused models with the
delegate; outputs match this process's LiteRT reference and the delegate claims the plan."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import MODELS
from delegate_checks import invoke_elsewhere, planned_nodes
from tflite_tools.fuse import fuse

REQUIREMENTS = ["tflite-runtime==2.14.0", "numpy<2"]


@pytest.fixture(scope="module")
def old_python():
    """A venv with tflite-runtime 2.14 in the dnnfusion cache."""
    from fusion.cost import default_cache_dir

    venv = default_cache_dir() / "venv-tflite-runtime-2.14"
    python = venv / "bin" / "python"
    if not (venv / "ready").exists():
        # Built in place (a venv records its own path); "ready" marks a finished one.
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *REQUIREMENTS],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            message = f"cannot install {REQUIREMENTS}: {proc.stderr.strip()[-800:]}"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
        (venv / "ready").write_text("ok\n")
    return python


@pytest.mark.parametrize("stem", ["transformer_encoder", "unet_tiny"])
def test_delegate_under_tflite_runtime_2_14(stem, old_python, tmp_path):
    version = subprocess.run([str(old_python), "-c", "import tflite_runtime, numpy; "
                              "print(tflite_runtime.__version__, numpy.__version__)"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert version[0] == "2.14.0" and version[1].startswith("1.")
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", cache_dir=tmp_path.parent / "k")

    def launch(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([str(old_python), *args], capture_output=True, text=True, timeout=300)

    errors, claims = invoke_elsewhere(launch, result, tmp_path, seed=5)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == planned_nodes(result)
