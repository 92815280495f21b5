"""GPU targets end to end through the delegate: OpenCL on PoCL and Vulkan on Mesa lavapipe (the
closest things to Adreno and Mali this machine has). Same comparison against LiteRT's reference
as the CPU path; and a trace of the device work (Halide's debug runtime, bench/gpu_counts.py)
proving that after the first invoke each invoke launches at most 3 kernels per block, allocates no
device memory, and copies exactly the partition's inputs to the device and its outputs back:
tensors stay on the device inside a partition.

`--gpu-precision fp16` (targets `host-*-fp16`) runs on lavapipe, which has shaderFloat16 and 16-bit
storage, held to tflite_tools.run.RTOL_FP16; PoCL has no cl_khr_fp16, so there an fp16 bundle must
decline everything with that reason and leave the model to TFLite.

Each run happens in a subprocess: the OpenCL ICD loader and the Vulkan loader read their
environment (OCL_ICD_VENDORS, VK_ICD_FILENAMES) once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MODELS, REPO
from delegate_checks import mobilenet_logits, planned_nodes
from tflite_tools import serialize
from tflite_tools.fuse import fuse
from tflite_tools.run import RTOL, RTOL_FP16

sys.path.insert(0, str(REPO / "bench"))

import gpu_counts  # noqa: E402

GPU_MODELS = ["unet_tiny", "transformer_encoder", "depthwise_residual", "fc_softmax", "video_cnn"]


def gpu_env(api: str) -> dict[str, str]:
    """The environment that points a subprocess at PoCL / lavapipe (bench/gpu_counts.device_env);
    skips without them, except in CI, where they are required."""
    try:
        return gpu_counts.device_env(api)
    except FileNotFoundError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc}: required in CI (scripts/install-system-deps.sh)")
        pytest.skip(str(exc))


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


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_cnn_logits_match_litert_on_the_gpu(api, tmp_path):
    # Inverted residuals: expand, depthwise and project convolutions with the residual ADD, whose
    # projection's accumulator is computed in the output's threads.
    env = gpu_env(api)
    result = fuse(mobilenet_logits(tmp_path), tmp_path / "out", target=f"host-{api}", cache_dir=tmp_path.parent / "kgpu")
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["claims"]["claimed_nodes"] == planned_nodes(result) and len(planned_nodes(result)) == 64
    assert report["ok"] and 0 < report["outputs"][0]["max_rel"] < 1e-5, report["outputs"]


@pytest.mark.parametrize("api, stem", [("opencl", "unet_tiny_int8"), ("opencl", "transformer_encoder_int8"),
                                       ("opencl", "cnn_16x8"), ("opencl", "attention_16x8"),
                                       ("opencl", "image_ops_16x8"), ("vulkan", "unet_tiny_int8"),
                                       ("vulkan", "mobilenet_v2_035_96_int8")])
def test_quantized_models_match_litert_on_the_gpu(api, stem, tmp_path):
    # Int8 and 16x8 blocks on the GPU: the same integer arithmetic as on the CPU (the reference
    # rounding), bit for bit LiteRT's. Every block with a lowering compiles (a GATHER's index
    # check runs on the host: lower.movement.index_operand). Vulkan
    # has no 64-bit integers: requantization takes 32-bit pieces there (LoweringOptions.wide_integers,
    # lower.fixed_point), the per-channel FULLY_CONNECTED's single rounding too (MobileNetV2's
    # classifier: rounded_once_in_32_bits).
    env = gpu_env(api)
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", target=f"host-{api}", cache_dir=tmp_path.parent / "kgpu")
    assert result.kernels and any(k.kernel for k in result.kernels)
    assert not [k for k in result.kernels if "cannot compile" in (k.skipped or "")]
    assert api == "opencl" or all(k.kernel for k in result.kernels)
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["claims"]["claimed_nodes"] == planned_nodes(result)
    assert report["outputs"][0]["max_abs"] == 0, report["outputs"]


def _one_op_matches_litert(api: str, tmp_path: Path, op: str, inputs: dict, out_shape: list[int],
                           consts: dict | None = None, **options) -> None:
    """Fuses a model of one op for `api`'s GPU and runs it against LiteRT with every node claimed."""
    from tflite_tools.model.builder import ModelBuilder

    b = ModelBuilder()
    args = [b.input(k, v) for k, v in inputs.items()] + [b.const(k, v) for k, v in (consts or {}).items()]
    b.output(b.op(op, args, out_shape, **options))
    _one_op_model_matches_litert(api, tmp_path, b)


def _one_op_model_matches_litert(api: str, tmp_path: Path, builder) -> dict:
    """Fuses the one-op model `builder` holds for `api`'s GPU, runs it against LiteRT with its node
    claimed and returns the report's outputs."""
    from tflite_tools import serialize

    (tmp_path / "op.tflite").write_bytes(serialize(builder.build()))
    result = fuse(tmp_path / "op.tflite", tmp_path / "out", target=f"host-{api}", cache_dir=tmp_path / "k")
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], gpu_env(api))
    assert proc.returncode == 0, proc.stderr[-2000:]  # a buffer overrun shows as an abort at exit
    report = json.loads(proc.stdout)
    assert report["ok"] and report["claims"]["claimed_nodes"] == [0], report
    return report["outputs"]


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_a_wide_softmax_matches_litert(api, tmp_path):
    # Classifier heads are 1000 wide: with its exps inlined into the shared-memory partial sums,
    # Vulkan's kernel summed them wrong (and overran its buffers on lavapipe) from some width up.
    _one_op_matches_litert(api, tmp_path, "SOFTMAX", {"logits": [2, 1000]}, [2, 1000], beta=1.0)


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_a_gpu_bundle_where_no_device_opens_claims_nothing_and_the_model_runs(api, tmp_path, private_cache):
    # No ICD, no driver (a phone without OpenCL): every kernel would fail its first launch, so the
    # delegate declines the whole bundle, even under claim:all; `require_device` refuses creation.
    env = {**os.environ, "OCL_ICD_VENDORS": str(tmp_path / "none"), "VK_ICD_FILENAMES": str(tmp_path / "none.json"),
           "VK_DRIVER_FILES": str(tmp_path / "none.json")}
    result = fuse(MODELS / "add_relu.tflite", tmp_path / "out", target=f"host-{api}", cache_dir=private_cache)
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["claims"]["claimed_nodes"] == [], report
    assert f"no {'OpenCL' if api == 'opencl' else 'Vulkan'} device could be opened" in \
        report["claims"]["declined"][0]["reason"]
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--option", "require_device=true"],
                   env)
    assert proc.returncode == 2 and "this device cannot run the kernels (require_device): no" in proc.stderr, \
        proc.stderr


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_a_hybrid_fully_connected_matches_litert_on_the_gpu(api, bits, tmp_path, private_cache):
    # Symmetric input quantization (float32 steps) runs on the device; the asymmetric form forms its
    # steps in double, which GPU targets lack: that block is left to TFLite with the reason. Int4
    # weights are unpacked to int8 on the host when the partition binds them.
    from tflite_tools.model.builder import ModelBuilder, quantization

    rng = np.random.default_rng(4)
    b = ModelBuilder()
    high = 2 ** (bits - 1)
    weights = b.const("w", rng.integers(-high + (bits == 8), high, (24, 32)).astype(np.int8), f"int{bits}",
                      quant=quantization(rng.uniform(0.002, 0.02, 24), 0, axis=0))
    b.output(b.op("FULLY_CONNECTED", [b.input("x", [3, 32]), weights, b.const("bias", rng.standard_normal(24))],
                  [3, 24], dtype="float32", fusedActivationFunction="RELU"))
    (output,) = _one_op_model_matches_litert(api, tmp_path, b)
    assert output["max_rel"] <= 1e-5, output
    b.graph.operators[0].options.asymmetricQuantizeInputs = True
    (tmp_path / "asymmetric.tflite").write_bytes(serialize(b.build()))
    result = fuse(tmp_path / "asymmetric.tflite", tmp_path / "asym", target=f"host-{api}", cache_dir=private_cache)
    assert "double, which GPU targets lack" in result.kernels[0].skipped


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_a_hybrid_conv2d_matches_litert_on_the_gpu(api, tmp_path):
    # One weight scale: the input quantized symmetrically, summed in dot products with the padding
    # read as its zero point; the image's extremes reduced row by row (no flat index into it, whose
    # arithmetic once needed 64-bit integers on Vulkan).
    from tflite_tools.model.builder import ModelBuilder, quantization

    rng = np.random.default_rng(5)
    b = ModelBuilder()
    weights = b.const("w", rng.integers(-127, 128, (12, 3, 3, 8)).astype(np.int8), "int8",
                      quant=quantization([0.01], 0, axis=0))
    b.output(b.op("CONV_2D", [b.input("x", [1, 7, 6, 8]), weights, b.const("bias", rng.standard_normal(12))],
                  [1, 7, 6, 12], dtype="float32", padding="SAME", strideH=1, strideW=1, fusedActivationFunction="RELU"))
    (output,) = _one_op_model_matches_litert(api, tmp_path, b)
    assert output["max_rel"] <= 1e-5, output


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_an_int16_softmax_matches_litert_on_the_gpu(api, tmp_path):
    # SoftmaxInt16 in 32-bit integers with its two tables: bit for bit on either API.
    from tflite_tools.model.builder import ModelBuilder, quantization

    b = ModelBuilder()
    x = b.input("x", (4, 300), "int16", quant=quantization(3e-4, 0))
    b.output(b.op("SOFTMAX", [x], (4, 300), quant=quantization(1 / 32768, 0), beta=1.0))
    assert _one_op_model_matches_litert(api, tmp_path, b)[0]["max_abs"] == 0


def _gather_model(op: str):
    """A GATHER (rows of a [5, 4] table) or GATHER_ND (elements of a [4, 6] one) whose indices are
    a model input, then a MUL in the same block."""
    from tflite_tools.model.builder import ModelBuilder

    b = ModelBuilder()
    if op == "GATHER":
        table, ids = b.input("table", [5, 4]), b.input("ids", [3], "int32")
        picked = b.op("GATHER", [table, ids], [3, 4], axis=0)
    else:
        table, ids = b.input("table", [4, 6]), b.input("ids", [3, 2], "int32")
        picked = b.op("GATHER_ND", [table, ids], [3])
    b.output(b.op("MUL", [picked, picked], list(picked.shape)))
    return b.build()


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
@pytest.mark.parametrize("op, good, bad, message", [
    ("GATHER", [4, 0, 2], [0, 5, 1], "gather index out of bounds: got 5 for a dimension of 5"),
    ("GATHER_ND", [[3, 5], [0, 0], [1, 2]], [[0, 1], [0, 6], [1, 1]],
     "gather_nd index out of bounds: got 6 for a dimension of 6"),
])
def test_gather_indices_are_checked_on_the_host(api, op, good, bad, message, tmp_path, private_cache):
    # Device code cannot fail an invoke: the partition checks indices read from data on the host
    # before the kernel runs (lower.movement.index_operand, ArgSpec::n_index_bounds). In range:
    # LiteRT's rows, with the block on the GPU; out of range: the invoke fails as LiteRT's does.
    from tflite_tools import serialize

    model = _gather_model(op)
    (tmp_path / "g.tflite").write_bytes(serialize(model))
    result = fuse(tmp_path / "g.tflite", tmp_path / "out", target=f"host-{api}", cache_dir=private_cache)
    assert [k.kernel is not None for k in result.kernels] == [True], [k.skipped for k in result.kernels]
    table_shape = model.main.inputs[0].shape
    np.save(tmp_path / "table.npy", np.arange(np.prod(table_shape), dtype=np.float32).reshape(table_shape))
    env = gpu_env(api)
    for indices, expected in ((good, None), (bad, message)):
        np.save(tmp_path / "ids.npy", np.array(indices, np.int32))
        proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--inputs",
                        str(tmp_path / "table.npy"), str(tmp_path / "ids.npy"), "--compare", "--json",
                        "--option", "claim=all"], env)
        if expected is None:
            assert proc.returncode == 0, proc.stderr[-2000:]
            report = json.loads(proc.stdout)
            assert report["claims"]["claimed_nodes"] == [0, 1] and report["outputs"][0]["max_abs"] == 0, report
        else:
            assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_resize_bilinear_reads_its_tables_on_the_gpu(api, tmp_path):
    # Source pixels and weights are constant tables of the output's rows and columns.
    _one_op_matches_litert(api, tmp_path, "RESIZE_BILINEAR", {"x": [1, 9, 16, 8]}, [1, 37, 64, 8],
                           {"size": np.array([37, 64], np.int32)}, half_pixel_centers=True)


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


def test_fp16_bundle_declines_an_opencl_device_without_fp16(tmp_path, private_cache):
    env = gpu_env("opencl")
    result = fuse(MODELS / "unet_tiny.tflite", tmp_path / "out", target="host-opencl-fp16", cache_dir=private_cache)
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["claims"]["claimed_nodes"] == [] and report["rtol"] == RTOL, report
    assert "lacks cl_khr_fp16" in report["claims"]["declined"][0]["reason"]
    assert report["ok"]


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
def test_gpu_autoschedulers_pick_a_source_per_block(api, tmp_path, private_cache):
    # fuse --autoschedulers on a GPU target times the GPU templates, Anderson2021 and Li2018 on the
    # API's device here and compiles the fastest per block; the bundle must stay correct.
    env = {**gpu_env(api), "DNNFUSION_CACHE_DIR": str(private_cache.parent)}
    out = tmp_path / "out"
    proc = run_cli(["fuse", str(MODELS / "depthwise_residual.tflite"), "-o", str(out), "--target", f"host-{api}",
                    "--autoschedulers"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    schedules = [k["schedule"] for k in plan["kernels"] if k["kernel"]]
    assert schedules and set(schedules) <= {"template", "Anderson2021", "Li2018"}, schedules
    timings = json.loads((private_cache.parent / "block-timings.json").read_text())
    assert any(key.startswith("schedule:") and f":host-{api}:" in key for key in timings)
    proc = run_cli(["run", str(out / "model.fused.tflite"), "--delegate", str(next(out.glob("*.so"))), "--compare",
                    "--json", "--option", "claim=all"], env)
    report = json.loads(proc.stdout)
    assert report["ok"] and report["claims"]["claimed_nodes"], report


@pytest.mark.parametrize("api", ["opencl", "vulkan"])
@pytest.mark.parametrize("stem", [*GPU_MODELS, "mobilenet_v2_035_96"])
def test_steady_invokes_launch_little_allocate_nothing_and_copy_only_at_edges(stem, api, tmp_path):
    # Halide's debug runtime traces every launch, device allocation and copy (bench/gpu_counts.py).
    # After the first invoke (weights go up once): at most 3 launches per block on average (one
    # per materialised stage, the rows in the grid, not one launch per row), no device allocation
    # (scratch buffers belong to the partition), and copies only of the partition's one input in
    # and one output out — the tensors between blocks never leave the device.
    gpu_env(api)  # skips (or fails in CI) without PoCL / lavapipe
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", target=f"host-{api}",
                  cache_dir=tmp_path.parent / "kgpu", debug_runtime=True)
    blocks = sum(1 for k in result.kernels if k.kernel)
    first, *_, steady = gpu_counts.trace(result.model, result.library, api, invokes=3)
    assert first.total.copies > 2 and first.total.launches == steady.total.launches
    assert steady.total.launches <= 3 * blocks, (steady.total, blocks)
    assert len(steady.blocks) == blocks
    assert steady.total.allocations == 0, steady.blocks
    assert steady.total.copies == 2, steady.total
