"""ARM64 end to end under qemu-aarch64: `fuse --target arm64-linux` cross-builds the delegate with
aarch64-linux-gnu-g++; an emulated aarch64 Python (tests/arm64_rootfs.py) runs the fused model
through the aarch64 LiteRT wheel with that delegate; outputs match the host's LiteRT reference
within tflite_tools.run's tolerance, and the delegate claims exactly the planned blocks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from arm64_rootfs import Unavailable, prepare, run_python
from conftest import MODELS
from tflite_tools import runtime
from tflite_tools.fuse import fuse
from tflite_tools.run import compare

# One model per kind of block: convolutions with pools and transposed convs, an inverted residual
# chain with depthwise convs, and a transformer layer (matmuls, softmax, layer norm, GELU).
MODELS_ARM64 = ["unet_tiny", "depthwise_residual", "transformer_encoder", "fc_softmax"]


def _missing(tool: str) -> bool:
    return shutil.which(tool) is None


@pytest.fixture(scope="module")
def rootfs():
    """The emulated aarch64 Python, cached in the user's dnnfusion cache across runs."""
    if _missing("qemu-aarch64") or _missing("aarch64-linux-gnu-g++"):
        if os.environ.get("CI") == "true":
            pytest.fail("qemu-user and g++-aarch64-linux-gnu are required in CI (scripts/install-system-deps.sh)")
        pytest.skip("needs qemu-user and g++-aarch64-linux-gnu")
    from fusion.cost import default_cache_dir

    try:
        return prepare(default_cache_dir())
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))


@pytest.mark.parametrize("stem", MODELS_ARM64)
def test_arm64_delegate_matches_host_litert(stem, rootfs, tmp_path):
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", target="arm64-linux", cache_dir=tmp_path.parent / "k64")
    host = runtime.make_interpreter(result.model, "reference")
    inputs = runtime.random_inputs(host, seed=4)
    paths = []
    for k, array in enumerate(inputs):
        paths.append(tmp_path / f"in{k}.npy")
        np.save(paths[-1], array)
    outs = [tmp_path / f"out{k}.npy" for k in range(len(host.get_output_details()))]
    report = tmp_path / "claims.jsonl"
    proc = run_python(rootfs, str(Path(__file__).parent / "invoke_with_delegate.py"), str(result.model), str(result.library),
                      str(report), *map(str, paths), "--", *map(str, outs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [np.load(p) for p in outs]
    errors = compare(got, runtime.run(host, inputs), [str(p) for p in outs])
    assert all(e.ok for e in errors), errors
    claims = [json.loads(line) for line in report.read_text().splitlines()][-1]
    assert claims["claimed_nodes"] == sorted(n for k in result.kernels if k.kernel for n in k.nodes)
    assert claims["claimed_nodes"]  # the emulated delegate really ran kernels
