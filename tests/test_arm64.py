"""ARM64 end to end under qemu-aarch64: `fuse --target arm64-linux` cross-builds the delegate with
aarch64-linux-gnu-g++; an emulated aarch64 Python (bench/arm64_rootfs.py) runs the fused model
through the aarch64 LiteRT wheel with that delegate; outputs match the host's LiteRT reference
within tflite_tools.run's tolerance, and the delegate claims exactly the planned blocks."""

from __future__ import annotations

import pytest

import tflite_tools
from arm64_rootfs import run_python
from conftest import MODELS
from delegate_checks import invoke_elsewhere, planned_nodes
from tflite_tools.fuse import fuse
from tflite_tools.run import RTOL_FP16

# One model per kind of block: convolutions with pools and transposed convs, an inverted residual
# chain with depthwise convs, a transformer layer (matmuls, softmax, layer norm, GELU), and the int8
# MobileNetV2, U-Net (integer requantization on NEON, int8 transposed convs) and transformer layer
# (int8 matmuls of two activations, layer norm's SQUARED_DIFFERENCE and RSQRT, a float output), a
# 16x8 CNN (int16 activations: 64-bit sums), a 16x8 attention layer (int16 BATCH_MATMUL, SoftmaxInt16) and a
# video CNN (3-D convolutions), and a dynamic-range encoder and CNN (hybrid FULLY_CONNECTED: SDOT on the
# int8 rows it quantizes as it runs; hybrid convolutions), and a decoder MLP with int4 weights, per
# channel and per block.
MODELS_ARM64 = ["unet_tiny", "depthwise_residual", "transformer_encoder", "fc_softmax", "video_cnn", "mobilenet_v2_035_96_int8",
                "unet_tiny_int8", "transformer_encoder_int8", "cnn_16x8", "attention_16x8", "transformer_encoder_dynamic_range",
                "mobilenet_v2_035_96_dynamic_range", "int4_mlp", "int4_blockwise_mlp"]


@pytest.mark.parametrize("stem", MODELS_ARM64)
def test_arm64_delegate_matches_host_litert(stem, arm64_root, tmp_path):
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", target="arm64-linux", cache_dir=tmp_path.parent / "k64")
    errors, claims = invoke_elsewhere(lambda args: run_python(arm64_root, *args), result, tmp_path, seed=4)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == planned_nodes(result) and claims["claimed_nodes"]
    assert claims["claimed_nodes"]  # the emulated delegate really ran kernels


def test_attention_heads_four_steps_do_not_divide_match_host_litert(arm64_root, tmp_path):
    # Heads of 26 and 18 take their products' steps in pairs of 64-bit loads, 7 one at a time
    # (schedule.tiles.float_steps), and the softmax between them runs 4 vectors a loop step
    # (Value.unrollable): in NEON code only, so run here.
    b = tflite_tools.ModelBuilder()
    for depth in (26, 18, 7):
        q, k = b.input(f"q{depth}", [1, 2, 20, depth]), b.input(f"k{depth}", [1, 2, depth, 32])
        probs = b.op("SOFTMAX", [b.op("BATCH_MATMUL", [q, k], [1, 2, 20, 32])], [1, 2, 20, 32], beta=1.0)
        b.output(b.op("BATCH_MATMUL", [probs, b.input(f"v{depth}", [1, 2, 32, depth])], [1, 2, 20, depth]))
    tflite_tools.save(b.build(), tmp_path / "heads.tflite")
    result = fuse(tmp_path / "heads.tflite", tmp_path / "out", target="arm64-linux", cache_dir=tmp_path.parent / "k64")
    errors, claims = invoke_elsewhere(lambda args: run_python(arm64_root, *args), result, tmp_path, seed=4)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == planned_nodes(result) and len(claims["claimed_nodes"]) == 9


def test_dot_product_kernels_decline_on_a_core_without_it(arm64_root, tmp_path):
    # arm64-linux kernels may use SDOT (ARMv8.2). On an ARMv8.0 core (qemu's cortex-a53) they would
    # die of SIGILL: the delegate declines every node and TFLite runs the model; the -nodot build
    # claims its blocks there. (A float model: XNNPACK's own int8 kernels stop with SIGILL under
    # qemu's cortex-a53 here, delegate or not.)
    model = MODELS / "depthwise_residual.tflite"
    on_a53 = lambda args: run_python(arm64_root, *args, cpu="cortex-a53")  # noqa: E731
    dot = fuse(model, tmp_path / "dot", target="arm64-linux", cache_dir=tmp_path.parent / "k64")
    errors, claims = invoke_elsewhere(on_a53, dot, tmp_path / "dot", seed=4)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == []
    assert any("dot-product instructions this CPU lacks" in d["reason"] for d in claims["declined"]), claims
    nodot = fuse(model, tmp_path / "nodot", target="arm64-linux-nodot", cache_dir=tmp_path.parent / "k64")
    assert nodot.library.name.endswith("_nodot.so")
    errors, claims = invoke_elsewhere(on_a53, nodot, tmp_path / "nodot", seed=4)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == planned_nodes(nodot)


def test_int8_without_dot_product_matches_host_litert(arm64_root, tmp_path):
    # The -nodot build sums the same 4-deep int8 groups without SDOT (Halide widens and adds
    # pairwise): still TFLite's integer arithmetic, bit for bit.
    result = fuse(MODELS / "mobilenet_v2_035_96_int8.tflite", tmp_path / "out", target="arm64-linux-nodot",
                  cache_dir=tmp_path.parent / "k64")
    errors, claims = invoke_elsewhere(lambda args: run_python(arm64_root, *args), result, tmp_path, seed=4)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == planned_nodes(result) and claims["claimed_nodes"]


# Float models computed in half precision (`--cpu-precision fp16`): a convolution chain with
# depthwise convs and a residual add, a transformer layer (matmuls of two activations, softmax, layer
# norm) and a U-Net (pools, transposed convs), held to run.RTOL_FP16 of each output's range; and
# convolutions whose weights TFLite decodes before the delegate's kernels read them (float16 weights
# behind a DEQUANTIZE, sparse ones behind a DENSIFY), packed and converted to fp16 by the delegate.
HALF_MODELS = ["depthwise_residual", "transformer_encoder", "unet_tiny", "conv_fp16_weights", "sparse_fp16_conv"]


@pytest.mark.parametrize("stem", HALF_MODELS)
def test_half_precision_kernels_match_host_litert_within_the_fp16_tolerance(stem, arm64_root, tmp_path):
    result = fuse(MODELS / f"{stem}.tflite", tmp_path / "out", target="arm64-linux-fp16",
                  cache_dir=tmp_path.parent / "k64")
    assert result.library.name.endswith("_fp16.so")
    errors, claims = invoke_elsewhere(lambda args: run_python(arm64_root, *args), result, tmp_path, seed=4,
                                      rtol=RTOL_FP16)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == planned_nodes(result) and claims["claimed_nodes"]


def test_half_precision_kernels_decline_on_a_core_without_fp16_arithmetic(arm64_root, tmp_path):
    # ARMv8.0 cores (qemu's cortex-a53) have no fp16 arithmetic: the delegate declines every node.
    result = fuse(MODELS / "depthwise_residual.tflite", tmp_path / "out", target="arm64-linux-fp16",
                  cache_dir=tmp_path.parent / "k64")
    on_a53 = lambda args: run_python(arm64_root, *args, cpu="cortex-a53")  # noqa: E731
    errors, claims = invoke_elsewhere(on_a53, result, tmp_path, seed=4)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == []
    assert any("half precision, which this CPU lacks" in d["reason"] for d in claims["declined"]), claims
