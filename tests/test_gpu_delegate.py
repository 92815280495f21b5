"""GPU targets end to end through the delegate: OpenCL on PoCL and Vulkan on Mesa lavapipe (the
closest things to Adreno and Mali this machine has). Same comparison against LiteRT's reference
as the CPU path; and a device-copy trace (Halide's debug runtime) proving that tensors stay on the
device inside a partition: after the first invoke, each invoke copies exactly the partition's
inputs to the device and its outputs back, nothing else.

`--gpu-precision fp16` (targets `host-*-fp16`) runs on lavapipe, which has shaderFloat16 and 16-bit
storage, held to tflite_tools.run.RTOL_FP16; PoCL has no cl_khr_fp16, so there an fp16 bundle must
decline everything with that reason and leave the model to TFLite.

Each run happens in a subprocess: the OpenCL ICD loader and the Vulkan loader read their
environment (OCL_ICD_VENDORS, VK_ICD_FILENAMES) once per process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODELS, REPO
from delegate_checks import planned_nodes
from tflite_tools.fuse import fuse
from tflite_tools.run import RTOL, RTOL_FP16

POCL_ICD = Path("/etc/OpenCL/vendors/pocl.icd")
LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
GPU_MODELS = ["unet_tiny", "transformer_encoder", "depthwise_residual", "fc_softmax"]


def gpu_env(api: str) -> dict[str, str]:
    icd = POCL_ICD if api == "opencl" else LAVAPIPE_ICD
    if not icd.exists():
        package = "pocl-opencl-icd" if api == "opencl" else "mesa-vulkan-drivers"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{package} is required in CI (scripts/install-system-deps.sh)")
        pytest.skip(f"needs {package}")
    key = "OCL_ICD_VENDORS" if api == "opencl" else "VK_ICD_FILENAMES"
    env = {k: v for k, v in os.environ.items() if k != "HL_VK_ALLOC_CONFIG"}
    return {**env, key: str(icd.parent if api == "opencl" else icd), "PYTHONPATH": str(REPO)}


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tflite_tools", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
@pytest.mark.parametrize("stem", GPU_MODELS)
def test_gpu_delegate_matches_litert(stem, api, tmp_path):
    # Vulkan: the delegate sets HL_VK_ALLOC_CONFIG itself (halide_gen.targets.VULKAN_ALLOC_CONFIG); the
    # environment here leaves it unset on purpose.
    env = gpu_env(api)
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", target=f"host-{api}", cache_dir=tmp_path.parent / "kgpu")
    assert result.library.name == f"lib{stem}_dnnfusion_{api}.so"
    # Untuned GPU kernels are slower than XNNPACK on the CPU: claimed only when asked (claim:all).
    assert result.kernels and not any(k.profitable for k in result.kernels)
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["claims"]["claimed_nodes"] == planned_nodes(result)
    assert report["ok"], report["outputs"]


@pytest.mark.parametrize("stem", GPU_MODELS)
def test_fp16_vulkan_delegate_matches_litert(stem, tmp_path):
    env = gpu_env("vulkan")
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", target="host-vulkan-fp16",
                  cache_dir=tmp_path.parent / "kgpu")
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["claims"]["claimed_nodes"] == planned_nodes(result)
    assert report["claims"]["target"] == "host-vulkan-fp16" and report["rtol"] == RTOL_FP16
    assert report["ok"], report["outputs"]
    # Half precision is really in use: the outputs are not float32-exact.
    assert max(o["max_rel"] for o in report["outputs"]) > RTOL, report["outputs"]


def test_fp16_bundle_declines_an_opencl_device_without_fp16(tmp_path):
    env = gpu_env("opencl")
    result = fuse(MODELS / "unet_tiny.tflite", tmp_path / "out", target="host-opencl-fp16", cache_dir=tmp_path / "k")
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["claims"]["claimed_nodes"] == [] and report["rtol"] == RTOL, report
    assert "lacks cl_khr_fp16" in report["claims"]["declined"][0]["reason"]
    assert report["ok"]


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_gpu_autoschedulers_pick_a_source_per_block(api, tmp_path):
    # fuse --autoschedulers on a GPU target times the GPU templates, Anderson2021 and Li2018 on the
    # API's device here and compiles the fastest per block; the bundle must stay correct.
    env = {**gpu_env(api), "DNNFUSION_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "out"
    proc = run_cli(["fuse", str(MODELS / "depthwise_residual.tflite"), "-o", str(out), "--target", f"host-{api}",
                    "--autoschedulers"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    schedules = [k["schedule"] for k in plan["kernels"] if k["kernel"]]
    assert schedules and set(schedules) <= {"template", "Anderson2021", "Li2018"}, schedules
    timings = json.loads((tmp_path / "cache" / "block-timings.json").read_text())
    assert any(key.startswith("schedule:") and f":host-{api}:" in key for key in timings)
    proc = run_cli(["run", str(out / "model.fused.tflite"), "--delegate", str(next(out.glob("*.so"))), "--compare",
                    "--json", "--option", "claim=all"], env)
    report = json.loads(proc.stdout)
    assert report["ok"] and report["claims"]["claimed_nodes"], report


COPY_TRACE = r"""
import sys
import numpy as np
from tflite_tools import runtime
d = runtime.load_delegate(sys.argv[2], options={"claim": "all", "log_level": "verbose"})
interp = runtime.make_interpreter(sys.argv[1], "xnnpack", 1, delegates=[d])
inputs = runtime.random_inputs(interp)
for k in range(3):
    print(f"=== invoke {k}", file=sys.stderr, flush=True)
    runtime.run(interp, inputs)
print("=== done", file=sys.stderr, flush=True)
"""


def test_opencl_copies_only_at_partition_edges(tmp_path):
    env = gpu_env("opencl")
    result = fuse(MODELS / "unet_tiny.tflite", tmp_path / "out", target="host-opencl", cache_dir=tmp_path / "k",
                  debug_runtime=True)
    assert len([k for k in result.kernels if k.kernel]) == 15  # one partition of 15 blocks
    proc = subprocess.run([sys.executable, "-c", COPY_TRACE, str(result.model), str(result.library)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    invokes = re.split(r"=== invoke \d+\n", proc.stderr.split("=== done")[0])[1:]
    copies = [chunk.count("CL: halide_opencl_buffer_copy") for chunk in invokes]
    launches = [chunk.count("CL: halide_opencl_run") for chunk in invokes]
    # First invoke: the input, every weight (uploaded once) and the output. Then: the one input
    # in and the one output out — the 14 tensors between blocks never leave the device.
    assert copies[0] > 2 and copies[1] == copies[2] == 2, copies
    assert launches[0] == launches[1] == launches[2] > 15, launches
