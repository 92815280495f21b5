"""Prepares the OpenCL delegate check for a machine with a real GPU (and no network): fuses a few
models for `host-opencl`, saves LiteRT reference outputs, and fetches what the device lacks —
the ai-edge-litert wheel for its Python and Debian's OpenCL ICD loader.

    python bench/opencl_device/prepare.py .gpucheck        # here; .gpucheck is git-ignored
    # there, with .gpucheck carried:
    cd .gpucheck && python3 -m pip install -q --no-index --no-deps --target /tmp/site whl/*.whl \
        && PYTHONPATH=/tmp/site python3 check.py

check.py (copied into the folder) names the OpenCL device, runs each fused model through LiteRT
with the delegate, compares with the saved reference (1e-4 of the output's range) and times the
delegate against XNNPACK on the device's CPU.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MODELS = ["tests/models/unet_tiny.tflite", "tests/models/transformer_encoder.tflite",
          "tests/models/depthwise_residual.tflite"]


def main(out: Path) -> int:
    """Fills `out` with the fused models, references, wheels, loader and check.py."""
    import numpy as np

    from tflite_tools import runtime
    from tflite_tools.fuse import fuse

    out.mkdir(parents=True, exist_ok=True)
    for path in MODELS:
        name = Path(path).stem
        result = fuse(REPO / path, out / name, target="host-opencl")
        ref = runtime.make_interpreter(result.model, "reference")
        inputs = runtime.random_inputs(ref, seed=7)
        for k, x in enumerate(inputs):
            np.save(out / name / f"in{k}.npy", x)
        for k, y in enumerate(runtime.run(ref, inputs)):
            np.save(out / name / f"ref{k}.npy", y)
        (out / name / "lib.txt").write_text(result.library.name)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_27_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "-d", str(out / "whl"), "ai-edge-litert==2.3.0",
                    "backports.strenum"], check=True)
    subprocess.run(["apt-get", "download", "ocl-icd-libopencl1"], cwd=out, check=True, capture_output=True)
    for deb in out.glob("ocl-icd-libopencl1_*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(out / "ocl")], check=True)
        deb.unlink()
    shutil.copy2(Path(__file__).with_name("check.py"), out / "check.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else REPO / ".gpucheck")))
