"""Every block of real converter output (fused, or a single op a kernel could claim), lowered to
Halide and checked against LiteRT (tests/blockcheck.py says how).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from blockcheck import check_model_blocks
from halide_gen.block import build_block
from opcheck import compare
from tflite_tools.model.builder import ModelBuilder

MODELS = ["transformer_encoder", "mobilenet_v2_035_96", "unet_tiny", "conv_fp16_weights", "swish_chain",
          "depthwise_residual", "reshape_transpose", "mobilenet_v2_035_96_int8"]


# The random-weight MobileNet's activations shrink to 1e-9 by its last blocks, below fp16's smallest
# subnormal (6e-8): in half precision they are zero, as on any fp16 GPU, so it is checked in fp32 only
# (its int8 twin has no float tensors to store in half precision).
FP16_MODELS = [m for m in MODELS if not m.startswith("mobilenet_v2_035_96")]


@pytest.mark.parametrize("stem, precision", [(m, "fp32") for m in MODELS] + [(m, "fp16") for m in FP16_MODELS])
def test_fused_blocks_match_litert(model_path, stem, precision):
    assert sum(check_model_blocks(model_path(stem), precision).values()) > 0


# The tiles of the host library's AVX2 and SSE2 builds (halide_gen.schedule.params), compiled for
# their own vector extension: AVX-512's are the default above.
X86_BUILDS = [("X86_AVX2", "x86-64-linux-avx-avx2-f16c-fma-sse41-jit"), ("X86_SSE", "x86-64-linux-jit")]


@pytest.mark.parametrize("params_name, target", X86_BUILDS, ids=[name for name, _ in X86_BUILDS])
@pytest.mark.parametrize("stem", ["transformer_encoder", "mobilenet_v2_035_96", "unet_tiny", "mobilenet_v2_035_96_int8"])
def test_fused_blocks_match_litert_under_each_x86_builds_tiles(model_path, stem, params_name, target):
    from halide_gen.schedule import params

    assert sum(check_model_blocks(model_path(stem), params=getattr(params, params_name), target=target).values()) > 0


def test_every_block_kind_is_covered(model_path):
    kinds = Counter()
    for stem in ("transformer_encoder", "swish_chain", "reshape_transpose", "depthwise_residual"):
        kinds += check_model_blocks(model_path(stem))
    expected = {"fully_connected + epilogue", "attention core", "reduction / normalisation",
                "elementwise chain", "data movement", "depthwise_conv_2d + epilogue"}
    assert expected <= set(kinds), kinds


def random_weights(seed: int, scale: float):
    """w(*shape): seeded normal float32 weights of the given scale."""
    rng = np.random.default_rng(seed)
    return lambda *shape: (rng.standard_normal(shape) * scale).astype(np.float32)


def _expand_then_depthwise(b: ModelBuilder, x, w, size: int, kernel: int, stride: int):
    """A 1x1 expand conv (24 -> 144, RELU6) on a size x size map, then a depthwise conv (SAME)."""
    e = b.op("CONV_2D", [x, b.const("we", w(144, 1, 1, 24)), b.const("be", w(144))], [1, size, size, 144],
             padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    out = -(-size // stride)
    return b.op("DEPTHWISE_CONV_2D", [e, b.const("wd", w(1, kernel, kernel, 144)), b.const("bd", w(144))],
                [1, out, out, 144], padding="SAME", stride_h=stride, stride_w=stride, depth_multiplier=1,
                fused_activation_function="RELU6")


def test_streamed_inverted_residual_matches_litert():
    # Large enough (two 64x64x144 intermediates, > X86.stream_bytes) that the CPU schedule streams the
    # expand conv and the depthwise input through sliding row buffers.
    from halide_gen.schedule.conv_chain import conv_chain

    w = random_weights(seed=3, scale=0.2)
    b = ModelBuilder()
    x = b.input("x", [1, 64, 64, 24])
    d = _expand_then_depthwise(b, x, w, 64, 3, 1)
    p = b.op("CONV_2D", [d, b.const("wp", w(24, 1, 1, 144)), b.const("bp", w(24))], [1, 64, 64, 24],
             padding="SAME", stride_h=1, stride_w=1)
    b.output(b.op("ADD", [p, x], [1, 64, 64, 24]))
    model = b.build()
    kernel = build_block("ir", model.main.operators, model.main.outputs)
    assert conv_chain(kernel) is not None
    compare(model)


def test_a_conv_chain_whose_intermediates_stay_in_cache_is_not_streamed_on_x86():
    # EfficientNet-B0's 56x56 expand conv (24 -> 144) and 5x5 stride-2 depthwise conv: 1.8 MB between
    # them. Streamed, each strip recomputed 3 expand-conv rows in 16 (1.1x XNNPACK's time); whole,
    # they run at its time. NEON keeps streaming from 1 MB.
    from halide_gen.schedule.conv_chain import conv_chain
    from halide_gen.schedule.params import NEON, X86

    b = ModelBuilder()
    b.output(_expand_then_depthwise(b, b.input("x", [1, 56, 56, 24]), random_weights(seed=4, scale=0.2), 56, 5, 2))
    kernel = build_block("chain", b.graph.operators, b.graph.outputs)
    assert conv_chain(kernel, X86.stream_bytes) is None
    assert conv_chain(kernel, NEON.stream_bytes) is not None


def test_squeeze_excite_gate_is_computed_once():
    # The gate (pool -> conv -> conv -> sigmoid, 16 values) is read broadcast by the MUL over the
    # whole feature map: schedules compute it once at the root instead of once per pixel.
    w = random_weights(seed=5, scale=0.3)
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 16])
    pooled = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], [1, 1, 1, 16], keep_dims=True)
    squeezed = b.op("CONV_2D", [pooled, b.const("w1", w(4, 1, 1, 16)), b.const("b1", w(4))], [1, 1, 1, 4],
                    padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU")
    excited = b.op("CONV_2D", [squeezed, b.const("w2", w(16, 1, 1, 4)), b.const("b2", w(16))], [1, 1, 1, 16],
                   padding="SAME", stride_h=1, stride_w=1)
    gate = b.op("LOGISTIC", [excited], [1, 1, 1, 16])
    b.output(b.op("MUL", [x, gate], [1, 8, 8, 16]))
    model = b.build()
    kernel = build_block("se", model.main.operators, model.main.outputs)
    gate_value = kernel.op_values[3][0]
    assert any(v.func is gate_value.func for v in kernel.broadcast_sources())
    compare(model)


@pytest.mark.parametrize("rows, width", [(6, 40), (5, 64)])
def test_layer_norm_is_one_block_that_matches_litert(rows, width):
    # Both MEANs of a LayerNorm in one kernel (fusion.table3.row_reductions_allowed), on rows of a
    # width that is not a multiple of the vector (40) and one that takes the partial sums (64).
    from fusion.cost import RooflineCost
    from fusion.ecg import build_ecg
    from fusion.plan import plan_fusion
    from graphgen import layer_norm_ops

    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input("x", [1, rows, width])
    residual = b.op("ADD", [x, b.input("y", [1, rows, width])], [1, rows, width])
    b.output(layer_norm_ops(b, residual, 1 + 0.1 * rng.standard_normal(width), rng.standard_normal(width), 1e-5))
    model = b.build()
    plan = plan_fusion(build_ecg(model.main), RooflineCost())
    assert len(plan.blocks) == 1
    compare(model, seeds=(0, 1))


@pytest.mark.parametrize("channels, inputs", [(20, 24), (176, 528)])
def test_a_block_output_a_depthwise_also_reads_is_not_read_past_its_last_channel(channels, inputs):
    # A convolution's result may be read past its last channel (its padded weights give zeros
    # there), but not once it is a block output that later ops read: they read the output
    # buffer, which ends at the last channel. NASNet-mobile's reduction cell (176 channels, a 7x7
    # depthwise on a 4x4 map): the kernel failed every run.
    w = random_weights(seed=5, scale=0.2)
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, inputs])
    c = b.op("CONV_2D", [x, b.const("wc", w(channels, 1, 1, inputs)), b.const("bc", w(channels))],
             [1, 4, 4, channels], padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU")
    d = b.op("DEPTHWISE_CONV_2D", [c, b.const("wd", w(1, 7, 7, channels)), b.const("bd", w(channels))],
             [1, 2, 2, channels], padding="SAME", stride_h=2, stride_w=2, depth_multiplier=1)
    p = b.op("CONV_2D", [d, b.const("wp", w(channels, 1, 1, channels)), b.const("bp", w(channels))],
             [1, 2, 2, channels], padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU")
    b.output(c, p)
    compare(b.build())
