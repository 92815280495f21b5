"""The delegate under tflite-runtime 2.14, the predecessor of ai-edge-litert that apps still ship:
a venv of its own (it needs numpy < 2), prepared once and cached, runs fused models with the
delegate; outputs match this process's LiteRT reference and the delegate claims the plan."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS
from tflite_tools import runtime
from tflite_tools.fuse import fuse
from tflite_tools.run import compare

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
    host = runtime.make_interpreter(result.model, "reference")
    inputs = runtime.random_inputs(host, seed=5)
    paths = []
    for k, array in enumerate(inputs):
        paths.append(tmp_path / f"in{k}.npy")
        np.save(paths[-1], array)
    outs = [tmp_path / f"out{k}.npy" for k in range(len(host.get_output_details()))]
    report = tmp_path / "claims.jsonl"
    proc = subprocess.run([str(old_python), str(Path(__file__).parent / "invoke_with_delegate.py"), str(result.model),
                           str(result.library), str(report), *map(str, paths), "--", *map(str, outs)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = compare([np.load(p) for p in outs], runtime.run(host, inputs), [str(p) for p in outs])
    assert all(e.ok for e in errors), errors
    claims = [json.loads(line) for line in report.read_text().splitlines()][-1]
    assert claims["claimed_nodes"] == sorted(n for k in result.kernels if k.kernel for n in k.nodes)
