"""Every block of real converter output (fused, or a single op a kernel could claim), lowered to
Halide and checked against LiteRT.

The model is rewritten and planned; LiteRT's reference kernels run the rewritten model with all
intermediate tensors kept; each fused block's Halide kernel is fed the block's inputs from that run
and must reproduce the block's outputs (tolerance: opcheck.FLOAT_RTOL). The int8 model runs on
LiteRT's builtin kernels instead (its reference int8 SOFTMAX aborts the process) and its blocks must
be within one quantization step of them (tests/test_lowering_int8.py says why).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import tflite_tools
from fusion.ecg import build_ecg
from fusion.plan import plan_fusion
from fusion.rewrite import rewrite
from halide_gen.block import build_block
from halide_gen.jit import JitKernel
from tflite_tools import runtime
from opcheck import BLOCK_FP16_RTOL, FLOAT_RTOL, compare
from tflite_tools.builder import ModelBuilder

RTOL = {"fp32": FLOAT_RTOL, "fp16": BLOCK_FP16_RTOL}

MODELS = ["transformer_encoder", "mobilenet_v2_035_96", "unet_tiny", "conv_fp16_weights", "swish_chain",
          "depthwise_residual", "reshape_transpose", "mobilenet_v2_035_96_int8"]


def block_kind(names: list[str]) -> str:
    """A coarse label of what a block computes, for coverage."""
    s = set(names)
    if {"CONV_2D", "DEPTHWISE_CONV_2D"} <= s:
        return "inverted residual"
    for heavy in ("CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED", "BATCH_MATMUL"):
        if heavy in s:
            return heavy.lower() + " + epilogue"
    if s & {"MEAN", "SUM", "SOFTMAX", "MAX_POOL_2D", "AVERAGE_POOL_2D"}:
        return "reduction / normalisation"
    if s <= {"RESHAPE", "TRANSPOSE", "CONCATENATION", "SLICE", "GATHER", "SQUEEZE", "EXPAND_DIMS"}:
        return "data movement"
    return "elementwise chain"


def check_model_blocks(path, precision: str = "fp32") -> Counter:
    model = tflite_tools.load(path)
    rewrite(model)
    data = tflite_tools.serialize(model)
    model = tflite_tools.parse(data)
    sg = model.main
    index = {id(t): k for k, t in enumerate(sg.tensors)}
    quantized = any(t.type_name == "INT8" for t in sg.tensors)
    interp = runtime.make_interpreter(data, resolver="builtin" if quantized else "reference", preserve_all_tensors=True)
    runtime.run(interp, runtime.random_inputs(interp, 3))
    plan = plan_fusion(build_ecg(sg))
    kinds: Counter = Counter()
    for block in plan.blocks:
        if block.opaque_reason:
            continue
        ops = [plan.ecg.nodes[i].op for i in block.ops]
        jit = JitKernel(build_block(block.name, ops, block.outputs, precision))
        got = jit(jit.inputs_from({id(t): interp.get_tensor(index[id(t)]) for t in block.inputs}))
        for t, out in zip(block.outputs, got):
            ref = interp.get_tensor(index[id(t)])
            if ref.dtype.kind == "f":
                err = np.abs(ref.astype(np.float64) - out).max() / max(float(np.abs(ref).max()), 1e-30)
                assert err <= RTOL[precision], f"{block.name} {[o.name for o in ops]}: {t.name} error {err:.3g}"
            elif t.type_name == "INT8":  # quantized: within one step of the builtin kernels
                assert np.abs(ref.astype(np.int32) - out).max() <= 1, f"{block.name}: {t.name}"
            else:
                assert np.array_equal(ref, out), f"{block.name}: {t.name}"
        kinds[block_kind([op.name for op in ops])] += 1
    return kinds


# The random-weight MobileNet's activations shrink to 1e-9 by its last blocks, below fp16's smallest
# subnormal (6e-8): in half precision they are zero, as on any fp16 GPU, so it is checked in fp32 only
# (its int8 twin has no float tensors to store in half precision).
FP16_MODELS = [m for m in MODELS if not m.startswith("mobilenet_v2_035_96")]


@pytest.mark.parametrize("stem, precision", [(m, "fp32") for m in MODELS] + [(m, "fp16") for m in FP16_MODELS])
def test_fused_blocks_match_litert(model_path, stem, precision):
    assert sum(check_model_blocks(model_path(stem), precision).values()) > 0


def test_every_block_kind_is_covered(model_path):
    kinds = Counter()
    for stem in ("transformer_encoder", "swish_chain", "reshape_transpose", "depthwise_residual"):
        kinds += check_model_blocks(model_path(stem))
    expected = {"fully_connected + epilogue", "batch_matmul + epilogue", "reduction / normalisation",
                "elementwise chain", "data movement", "depthwise_conv_2d + epilogue"}
    assert expected <= set(kinds), kinds


def random_weights(seed: int, scale: float):
    """w(*shape): seeded normal float32 weights of the given scale."""
    rng = np.random.default_rng(seed)
    return lambda *shape: (rng.standard_normal(shape) * scale).astype(np.float32)


def test_streamed_inverted_residual_matches_litert():
    # Large enough (48x48x144 intermediates, > STREAM_BYTES) that the CPU schedule streams the
    # expand conv and the depthwise input through sliding row buffers.
    from halide_gen.schedule.cpu import _conv_chain

    w = random_weights(seed=3, scale=0.2)
    b = ModelBuilder()
    x = b.input("x", [1, 48, 48, 24])
    e = b.op("CONV_2D", [x, b.const("we", w(144, 1, 1, 24)), b.const("be", w(144))], [1, 48, 48, 144],
             padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    d = b.op("DEPTHWISE_CONV_2D", [e, b.const("wd", w(1, 3, 3, 144)), b.const("bd", w(144))], [1, 48, 48, 144],
             padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1, fused_activation_function="RELU6")
    p = b.op("CONV_2D", [d, b.const("wp", w(24, 1, 1, 144)), b.const("bp", w(24))], [1, 48, 48, 24],
             padding="SAME", stride_h=1, stride_w=1)
    b.output(b.op("ADD", [p, x], [1, 48, 48, 24]))
    model = b.build()
    kernel = build_block("ir", model.main.operators, model.main.outputs)
    assert _conv_chain(kernel) is not None
    compare(model)


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
