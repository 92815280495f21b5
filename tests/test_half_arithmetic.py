"""Half-precision arithmetic (`fuse --cpu-precision fp16`, the `-fp16` ARM targets): convolutions and
matrix products multiply and sum in fp16 from weights stored in it, as XNNPACK's fp16 kernels do.

Each op is held to the bound of what it computes: K products summed in order in fp16 (each input and
weight rounded to fp16 first, the output rounded once more when stored) are within
gamma(K + 4) * sum |x_k w_k| (+ |bias|) of the exact sum, gamma(n) = n u / (1 - n u), u = 2^-11
(Higham, Accuracy and Stability of Numerical Algorithms, 3.1). The sum of magnitudes is the same model
run by LiteRT's reference kernels on the inputs', weights' and bias' magnitudes. The JIT here computes
fp16 arithmetic by rounding each float32 result (the same values as ARM's, where an FMA's single
rounding is only nearer); tests/test_arm64.py runs the ARM builds under qemu.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from opcheck import halide, reference
from tflite_tools.model.builder import ModelBuilder

HALF = 2.0 ** -11  # fp16's unit roundoff


def gamma(n: int) -> float:
    """The relative bound of n roundings in fp16."""
    return n * HALF / (1 - n * HALF)


def _half_options():
    from halide_gen.targets import target_spec

    return target_spec("arm64-linux-fp16").lowering_options()


def _fully_connected(m, rows, depth, units, act=0):
    b = ModelBuilder()
    b.output(b.op("FULLY_CONNECTED", [b.input("x", (rows, depth)), b.const("w", m(np.float32, (units, depth))),
                                      b.const("b", m(np.float32, (units,)))], (rows, units),
                  fused_activation_function=act))
    return b.build(), depth


def _conv(m, hw, cin, cout, k, stride, act=0):
    b = ModelBuilder()
    out_hw = -(-hw // stride)
    b.output(b.op("CONV_2D", [b.input("x", (1, hw, hw, cin)), b.const("w", m(np.float32, (cout, k, k, cin))),
                              b.const("b", m(np.float32, (cout,)))], (1, out_hw, out_hw, cout),
                  padding=0, stride_h=stride, stride_w=stride, fused_activation_function=act))
    return b.build(), k * k * cin


def _depthwise(m, hw, channels, k, stride, act=0):
    b = ModelBuilder()
    out_hw = -(-hw // stride)
    b.output(b.op("DEPTHWISE_CONV_2D", [b.input("x", (1, hw, hw, channels)),
                                        b.const("w", m(np.float32, (1, k, k, channels))),
                                        b.const("b", m(np.float32, (channels,)))], (1, out_hw, out_hw, channels),
                  padding=0, stride_h=stride, stride_w=stride, depth_multiplier=1, fused_activation_function=act))
    return b.build(), k * k


def _batch_matmul(m, batch, rows, depth, cols, act=0):
    b = ModelBuilder()
    b.output(b.op("BATCH_MATMUL", [b.input("a", (batch, rows, depth)), b.input("b", (batch, depth, cols))],
                  (batch, rows, cols)))
    return b.build(), depth


# Each with a fused activation (TFLite's codes: 1 RELU, 3 RELU6), computed on the fp16 sum: a clamp
# moves no value further from the exact one, so the bound holds (its magnitudes model has none).
RELU, RELU6 = 1, 3
CASES = {
    "fully_connected": lambda m, act: _fully_connected(m, 7, 300, 40, act),
    "fully_connected_relu": lambda m, act: _fully_connected(m, 7, 64, 40, act and RELU),
    "conv_3x3": lambda m, act: _conv(m, 9, 12, 20, 3, 1),
    "conv_3x3_stride_2_relu6": lambda m, act: _conv(m, 10, 5, 16, 3, 2, act and RELU6),
    "depthwise_3x3_relu6": lambda m, act: _depthwise(m, 11, 24, 3, 1, act and RELU6),
    "depthwise_5x5_stride_2": lambda m, act: _depthwise(m, 12, 16, 5, 2),
    "batch_matmul": lambda m, act: _batch_matmul(m, 2, 5, 64, 24),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_half_precision_op_is_within_the_bound_of_fp16_sums(case):
    rng = np.random.default_rng(7)
    arrays: list[np.ndarray] = []

    def made(dtype, shape):  # weights and bias, remembered so that their magnitudes make the bound's model
        arrays.append(rng.standard_normal(shape).astype(dtype))
        return arrays[-1]

    model, depth = CASES[case](made, True)
    weights = iter([np.abs(a) for a in arrays])
    magnitudes, _ = CASES[case](lambda dtype, shape: next(weights), False)
    inputs = [rng.standard_normal(t.shape).astype(np.float32) for t in model.main.inputs]
    (expected,) = reference(model, inputs)
    (bound,) = reference(magnitudes, [np.abs(x) for x in inputs])
    (ours,) = halide(model, inputs, _half_options())
    error = np.abs(ours - expected)
    assert np.all(error <= gamma(depth + 4) * bound), float(np.max(error / (gamma(depth + 4) * bound)))
    # and it is fp16 arithmetic, not float32's: some element is further off than float32 could be
    assert np.max(error / bound) > 64 * np.finfo(np.float32).eps


def test_a_half_precision_matrix_product_sums_eight_fp16_lanes_from_fp16_weights():
    # NEON's fp16 tiles: the accumulators are vectors of 8 fp16 lanes (one register each, `fmla .8h`)
    # fed by weights passed in fp16, and the float32 input is converted to fp16 once, outside the sum.
    # With 4 steps a load (half a register) the A76's matrix products issued 1.4-1.6 of its 2 FMLAs a
    # cycle, each load staged through the stack.
    from halide_gen.schedule.params import NEON_FP16
    from halide_text import scheduled_stmt

    model, _ = _fully_connected(lambda dtype, shape: np.ones(shape, dtype), 18, 64, 64, RELU6)
    stmt = scheduled_stmt(model, NEON_FP16, _half_options())
    allocations = "\n".join(line.strip() for line in stmt.splitlines() if "allocate" in line)
    tile = re.search(r"allocate \w*fully_connected_acc\[float16 \* (\d+) \* \d+\]", stmt)
    assert tile and int(tile.group(1)) % 8 == 0, f"no fp16 tile of whole 8-lane vectors:\n{allocations}"
    # each row's input read 8 steps at a time: one register, each lane a step's `fmla` by element
    assert re.search(r"allocate \w*half_in_\w*acc\[float16 \* 8 \* \d+\]", stmt), \
        f"no 8-step input loads:\n{allocations}"
    sums = [line for line in stmt.splitlines()
            if re.search(r"acc\[ramp\(\d+, 1, 8\)\] = \w*acc\[[^\]]*\] \+", line)]
    assert sums, "no sums of 8 lanes"
    assert not [line for line in sums if "float32" in line], "a conversion inside the sum"
    weights = [re.search(r"\+ \((\w+)\[ramp\([^\]]*, 1, 8\)", line) for line in sums]
    assert all(weights), "the weights are no dense vectors"
    from halide_gen.block import build_block

    kernel = build_block("blk", model.main.operators, model.main.outputs, _half_options())
    assert {a.type_name for a in kernel.arguments if a.tensor.is_constant} == {"FLOAT16"}  # weights and bias


def test_run_holds_each_precision_to_its_own_tolerance():
    # `run --compare` reads the bundle's target from the delegate's report: fp16 sums (ARM's
    # --cpu-precision fp16) round K times a sum, fp16 storage (the GPUs') once an op.
    from tflite_tools.run import RTOL, RTOL_FP16, RTOL_HALF_ARITHMETIC, tolerance

    claimed = {"claimed_nodes": [0, 1]}
    assert tolerance({**claimed, "target": "arm64-linux-fp16"}) == RTOL_HALF_ARITHMETIC
    assert tolerance({**claimed, "target": "arm64-android-fp16-int8-xnnpack"}) == RTOL_HALF_ARITHMETIC
    assert tolerance({**claimed, "target": "host-vulkan-fp16"}) == RTOL_FP16
    assert tolerance({**claimed, "target": "arm64-linux"}) == tolerance({"claimed_nodes": [], "target":
                                                                        "arm64-linux-fp16"}) == RTOL
    assert RTOL < RTOL_FP16 < RTOL_HALF_ARITHMETIC
