"""Half-precision arithmetic (`fuse --cpu-precision fp16`, the `-fp16` ARM targets): convolutions and
matrix products multiply and sum in fp16 from weights stored in it, as XNNPACK's fp16 kernels do, and
the elementwise ops, the sigmoid, GELU's tanh form and softmax's exponentials between them compute in it.

Each product op is held to the bound of what it computes: K products summed in order in fp16 (each input and
weight rounded to fp16 first, the output rounded once more when stored) are within
gamma(K + 4) * sum |x_k w_k| (+ |bias|) of the exact sum, gamma(n) = n u / (1 - n u), u = 2^-11
(Higham, Accuracy and Stability of Numerical Algorithms, 3.1). The sum of magnitudes is the same model
run by LiteRT's reference kernels on the inputs', weights' and bias' magnitudes. The JIT here computes
fp16 arithmetic by rounding each float32 result (the same values as ARM's, where an FMA's single
rounding is only nearer); tests/test_arm64.py runs the ARM builds under qemu.
"""

from __future__ import annotations

import re

import halide as hl
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


def _elementwise_chain(op):
    """x * c (a block input and a constant), then `op` on that fp16 result and, for a binary op, a
    second constant broadcast along the rows: both ops compute in the block."""
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    shape = (6, 40)
    scale = b.const("c", _fp16_values(rng, (40,)))
    scaled = b.op("MUL", [b.input("x", shape), scale], shape)
    if op in HALF_UNARY:
        b.output(b.op(op, [scaled], shape))
    else:
        name, act = op.split("+") if "+" in op else (op, None)
        fused = {"fused_activation_function": {"RELU": RELU, "RELU6": RELU6}[act]} if act else {}
        b.output(b.op(name, [scaled, b.const("d", _fp16_values(rng, (1, 40)))], shape, **fused))
    return b.build()


def _fp16_values(rng, shape):
    """Values fp16 holds exactly, of every class: normal and subnormal, zeros, up to 2^15, inf, NaN."""
    values = rng.standard_normal(shape) * np.exp2(rng.integers(-20, 16, shape))
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, -65504.0, 6.0e-8, 1.0, -1.0])
    flat = values.reshape(-1)
    flat[: len(specials)] = specials[: flat.size]
    return flat.reshape(shape).astype(np.float16).astype(np.float32)


# Exact: one rounding from float32's result (+, -, *, /: double rounding is innocuous), or none.
EXACT_IN_HALF = ["ADD", "ADD+RELU", "SUB", "SUB+RELU6", "MUL", "MUL+RELU", "DIV", "ABS", "NEG", "RELU", "RELU6",
                 "RELU_N1_TO_1"]
# Up to four fp16 roundings (HARD_SWISH's 1/6 among them) where float32 computes and rounds once; near
# zero, where fp16 steps by 2^-24, HARD_SWISH's x / 6 is off by up to a step before it is scaled by up to 6.
ROUNDED_IN_HALF = ["SQUARE", "SQUARED_DIFFERENCE", "HARD_SWISH"]
HALF_UNARY = {"ABS", "NEG", "RELU", "RELU6", "RELU_N1_TO_1", "SQUARE", "HARD_SWISH"}


@pytest.mark.parametrize("op", EXACT_IN_HALF + ROUNDED_IN_HALF)
def test_elementwise_ops_in_half_precision_round_as_float32_rounded_to_fp16(op):
    # Under --cpu-precision fp16 these ops compute in fp16 (8 lanes a NEON register, no conversions
    # between the ops of a block), where before they widened each operand to float32 and rounded the
    # result back; on values fp16 holds, the results are the same, saturating at +-65504 as a stored
    # float32 result does (an attention mask of -1e9 stays finite), NaN and infinities as before.
    import dataclasses

    from halide_gen.lower.elementwise import HALF_BINARY
    from halide_gen.lower.elementwise import HALF_UNARY as LOWERED_HALF_UNARY

    binary = {o.split("+")[0] for o in EXACT_IN_HALF + ROUNDED_IN_HALF if o not in HALF_UNARY}
    assert set(LOWERED_HALF_UNARY) == HALF_UNARY | {"LOGISTIC"} and HALF_BINARY == binary
    model = _elementwise_chain(op)
    inputs = [_fp16_values(np.random.default_rng(6), (6, 40))]
    half = _half_options()
    (ours,) = halide(model, inputs, half)
    (widened,) = halide(model, inputs, dataclasses.replace(half, half_arithmetic=False))
    assert np.abs(ours[np.isfinite(ours)]).max() <= 65504 and np.array_equal(np.isnan(ours), np.isnan(widened))
    if op in EXACT_IN_HALF:
        np.testing.assert_array_equal(ours, widened)
    else:
        both = np.isfinite(ours) & np.isfinite(widened)
        assert np.all(np.abs(ours - widened)[both] <= gamma(4) * np.abs(widened)[both] + 8 * 2.0 ** -24)
    last = _result(model)
    assert last.type() == hl.Float(16) and "float32" not in str(last.value()), str(last.value())


def _every_fp16() -> np.ndarray:
    """Every fp16 value (NaNs and infinities among them), as float32."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def _steps(ours: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """How many fp16 values lie between ours and the exact value rounded to fp16."""
    return np.abs(ours.astype(np.float16).view(np.int16).astype(int) - exact.astype(np.float16).view(np.int16).astype(int))


@pytest.mark.parametrize("where", ["jit", pytest.param("arm64", marks=pytest.mark.cross)])
def test_the_half_precision_sigmoid_swish_and_tanh_gelu_over_every_fp16_input(where, tmp_path, request):
    # The fp16 functions (LOGISTIC, x * LOGISTIC(x), GELU's tanh form) over every fp16 input, in this
    # host's JIT and compiled for ARM, where LLVM may reassociate what the JIT computes as written.
    # - the sigmoid: within 2 steps of the exact value rounded to fp16 where that is a normal fp16, within
    #   fp16's smallest normal below (the exact one under it; XNNPACK's fp16 kernel flushes those to 0);
    #   +-inf give 0 and 1;
    # - swish (EfficientNet's every depthwise block): within 2 steps for x > -9 (a normal exact value),
    #   within 2e-4 below, where the exact one is under 1.1e-3;
    # - GELU's tanh form (GPT-2's), x * sigmoid(2u): within 1.5 x 2^-10 |x| (and fp16's subnormal step).
    x = _every_fp16()
    x = x[~np.isnan(x)]
    b = ModelBuilder()
    xi = b.input("x", x.shape)
    sigmoid = b.op("LOGISTIC", [xi], x.shape)
    b.output(sigmoid, b.op("MUL", [xi, sigmoid], x.shape), b.op("GELU", [xi], x.shape, approximate=True))
    model = b.build()
    if where == "jit":
        ours = halide(model, [x], _half_options())
    else:
        import opcheck

        request.getfixturevalue("cross_tools")
        ours = opcheck.aot(model, [x], "arm64-linux-fp16", tmp_path)
    sigmoid, swish, gelu = ours
    wide = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        exact_sigmoid = 1 / (1 + np.exp(-wide))
    tiny = np.finfo(np.float16).tiny

    assert sigmoid[x == -np.inf] == 0 and sigmoid[x == np.inf] == 1
    normal = exact_sigmoid >= tiny
    assert _steps(sigmoid, exact_sigmoid)[normal].max() <= 2, float(x[normal][np.argmax(_steps(sigmoid, exact_sigmoid)[normal])])
    assert np.all(np.abs(sigmoid[~normal] - exact_sigmoid[~normal]) <= tiny)

    finite = np.isfinite(x)
    with np.errstate(invalid="ignore"):
        exact_swish = wide * exact_sigmoid  # NaN at -inf, left out below
    near = finite & (x > -9) & (np.abs(exact_swish) >= tiny)
    assert _steps(swish, exact_swish)[near].max() <= 2, float(x[near][np.argmax(_steps(swish, exact_swish)[near])])
    assert np.all(np.abs(swish - exact_swish)[finite & ~near] <= 2e-4)

    with np.errstate(over="ignore", invalid="ignore"):
        exact_gelu = 0.5 * wide * (1 + np.tanh(np.sqrt(2 / np.pi) * (wide + 0.044715 * wide ** 3)))
    error = np.abs(gelu - exact_gelu)[finite]
    bound = 1.5 * 2.0 ** -10 * np.abs(wide[finite]) + 2.0 ** -24
    assert np.all(error <= bound), float(x[finite][np.argmax(error / bound)])


def test_the_half_precision_tanh_gelu_computes_in_fp16():
    b = ModelBuilder()
    b.output(b.op("GELU", [b.input("x", (4, 8))], (4, 8), approximate=True))
    assert _result(b.build()).type() == hl.Float(16)


def test_half_precision_epilogues_compare_whole_vectors(tmp_path):
    # LLVM compares fp16 vectors a lane at a time on ARM (fcmp, csetm and an insert per lane: the
    # swish of EfficientNet's blocks cost 1.6-2.0x XNNPACK's instructions); the fp16 functions test
    # bits instead, so a conv + swish + hard-swish block has no scalar fp16 compare.
    from halide_gen.aot import compile_kernel

    b = ModelBuilder()
    conv = b.op("CONV_2D", [b.input("x", (1, 8, 8, 16)), b.const("w", np.ones((32, 1, 1, 16), np.float32)),
                            b.const("b", np.zeros(32, np.float32))], (1, 8, 8, 32), padding=0, stride_h=1, stride_w=1)
    swish = b.op("MUL", [conv, b.op("LOGISTIC", [conv], (1, 8, 8, 32))], (1, 8, 8, 32))
    b.output(b.op("HARD_SWISH", [b.op("GELU", [swish], (1, 8, 8, 32), approximate=True)], (1, 8, 8, 32)))
    sg = b.build().main
    art = compile_kernel(sg.operators, sg.outputs, "arm64-linux-fp16", cache_dir=tmp_path, emit_asm=True)
    listing = "".join(p.read_text() for p in art.extra if p.suffix == ".s")
    assert re.search(r"\bfdiv\s+v\d+\.8h", listing), "no fp16 sigmoid"
    assert not re.findall(r"\bfcmp\s+h\d+", listing)


@pytest.mark.parametrize("factor", ["LOGISTIC", "NEG"])
def test_only_a_product_that_could_overflow_saturates(factor):
    # Swish's x * sigmoid(x) stays within fp16's range (|sigmoid| <= 1): no clamp to +-65504, two
    # instructions of the sigmoid's ~20 a vector; x * -x needs it.
    b = ModelBuilder()
    x = b.input("x", (4, 16))
    b.output(b.op("MUL", [x, b.op(factor, [x], (4, 16))], (4, 16)))
    model = b.build()
    saturated = re.search(r"float16: max\(min\(.*, 65504\.0+h\), -65504\.0+h\)>$", str(_result(model).value()))
    assert bool(saturated) == (factor == "NEG"), str(_result(model).value())
    inputs = [_fp16_values(np.random.default_rng(1), (4, 16))]
    (ours,) = halide(model, inputs, _half_options())
    assert np.abs(ours[np.isfinite(ours)]).max() <= 65504


def test_an_attention_mask_of_the_lowest_float_stays_finite_in_half_precision():
    # Hugging Face builds a padding mask as (1 - mask) * finfo(float32).min: in fp16 that constant
    # would be -inf, and 0 * -inf NaN for every unmasked score. Constants saturate at -65504, as
    # stored fp16 results do, so the masked scores get softmax's 0 and the others their share.
    b = ModelBuilder()
    scores, mask = b.input("scores", (2, 8)), b.input("mask", (2, 8))
    inverted = b.op("SUB", [b.const("one", np.ones((1,), np.float32)), mask], (2, 8))
    bias = b.op("MUL", [inverted, b.const("lowest", np.array([np.finfo(np.float32).min], np.float32))], (2, 8))
    b.output(b.op("SOFTMAX", [b.op("ADD", [scores, bias], (2, 8))], (2, 8), beta=1.0))
    model = b.build()
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((2, 8)).astype(np.float32), (rng.random((2, 8)) < 0.6).astype(np.float32)]
    (expected,) = reference(model, inputs)
    (ours,) = halide(model, inputs, _half_options())
    assert not np.isnan(ours).any() and np.abs(ours - expected).max() <= 1e-2, (ours, expected)


@pytest.mark.parametrize("op", ["SIN", "COS"])
def test_a_rotary_angle_stays_float32_under_half_arithmetic(op):
    # A decoder's rotary embedding: positions (int32) cast to float, times each frequency, then
    # SIN and COS. In fp16 the angle at position 1000 is stored with a step of 0.5, and the sine of
    # it is off by up to 0.25 (a 60M decoder's keys 0.14 of their range off, prefilling 512 tokens).
    # What reaches a periodic function's argument stays float32, computed in it; the sine is
    # then within fp16's rounding of its result.
    b = ModelBuilder()
    positions = b.op("CAST", [b.input("pos", (1, 1024, 1), dtype="int32")], (1, 1024, 1), dtype="float32")
    frequencies = b.const("inv_freq", (1.0 / 10000.0 ** (np.arange(16) / 16)).astype(np.float32).reshape(1, 1, 16))
    angles = b.op("MUL", [positions, frequencies], (1, 1024, 16))
    b.output(b.op("ADD", [b.op(op, [angles], (1, 1024, 16)), b.input("x", (1, 1024, 16))], (1, 1024, 16)))
    model = b.build()
    inputs = [np.arange(1024, dtype=np.int32).reshape(1, 1024, 1), np.zeros((1, 1024, 16), np.float32)]
    (expected,) = reference(model, inputs)
    (ours,) = halide(model, inputs, _half_options())
    assert np.abs(ours - expected).max() <= 2 * HALF, np.abs(ours - expected).max()


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_softmax_exponentiates_in_half_precision(beta):
    # Under fp16 arithmetic the exponentials (attention's one per score) are fp16 ones, 8 lanes a
    # vector, from the row's max minus each score; the sums stay float32. Within fp16's tolerance of
    # LiteRT's reference, a row of very negative scores (a padding mask's) included (NaN: on ARM,
    # test_half_precision_elementwise_ops_keep_nan_on_arm64).
    from halide_gen.schedule.params import NEON_FP16
    from halide_text import scheduled_stmt

    b = ModelBuilder()
    b.output(b.op("SOFTMAX", [b.input("x", (4, 40))], (4, 40), beta=beta))
    model = b.build()
    x = (np.random.default_rng(2).standard_normal((4, 40)) * 4).astype(np.float32)
    x[1, :30] = -60000.0
    (expected,) = reference(model, [x])
    (ours,) = halide(model, [x], _half_options())
    assert np.abs(ours - expected).max() <= 2e-3, np.abs(ours - expected).max()
    stmt = scheduled_stmt(model, NEON_FP16, _half_options())
    exps = [line for line in stmt.splitlines() if re.match(r"\s*\w*softmax_exp\[ramp\(\d+, 1, 8\)\] = ", line)]
    # (no float32 value or constant: those print as "float32" and "1.000000f")
    assert exps and not [line for line in exps if re.search(r"float32|\d\.\d+f\b", line)], exps[:1]


def _result(model):
    """The Func of `model`'s last op's result, lowered under fp16 arithmetic."""
    from halide_gen.block import build_block

    kernel = build_block("blk", model.main.operators, model.main.outputs, _half_options())
    return kernel.values[id(model.main.operators[-1].outputs[0])].func


@pytest.mark.cross
def test_half_precision_elementwise_ops_keep_nan_on_arm64(tmp_path, cross_tools):
    # Built for arm64-linux-fp16 and run under qemu: NaN passes through the fp16 elementwise ops and
    # softmax's fp16 exponentials (ARM's fmin / fmax keep it in their saturating clamps, where this
    # host's JIT drops it; a NaN makes its softmax row NaN), and the chain stays within fp16's
    # tolerance of LiteRT's reference.
    import opcheck
    from tflite_tools.run import RTOL_FP16

    b = ModelBuilder()
    scaled = b.op("MUL", [b.input("x", (4, 16)), b.const("c", np.linspace(-2, 2, 16).astype(np.float32))], (4, 16))
    summed = b.op("ADD", [b.op("LOGISTIC", [scaled], (4, 16)), scaled], (4, 16))
    swished = b.op("HARD_SWISH", [summed], (4, 16))
    b.output(swished, b.op("SOFTMAX", [swished], (4, 16), beta=1.0))
    model = b.build()
    x = (np.random.default_rng(0).standard_normal((4, 16)) * 4).astype(np.float32)
    x[0, :2], x[1, 3] = np.nan, np.nan
    for ours, expected in zip(opcheck.aot(model, [x], "arm64-linux-fp16", tmp_path), reference(model, [x])):
        assert np.array_equal(np.isnan(ours), np.isnan(expected)) and np.isnan(ours).sum() in (3, 32)
        finite = ~np.isnan(expected)
        assert np.abs(ours - expected)[finite].max() <= RTOL_FP16 * np.abs(expected[finite]).max()


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
