"""Every int8 lowering against LiteRT, on random int8 inputs with awkward sizes and the option
combinations of the quantized reference model (per-channel weights, nonzero zero points, fused
RELU / RELU6, strides, dilation, depth multipliers, broadcasting).

Tolerance: the integer-arithmetic ops (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, MEAN) must
equal LiteRT's reference kernels exactly, and every op must be within one quantization step (1 LSB)
of LiteRT's optimized builtin kernels, which round a few requantizations differently. SOFTMAX is
computed in float and rounded once (halide_gen/lower/quantized.py), so it is held to the 1 LSB bound
alone.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import tflite_tools
from halide_gen.block import build_block
from halide_gen.jit import JitKernel
from halide_gen.lower import LoweringError
from halide_gen.lower.fixed_point import quantize_multiplier
from halide_gen.lowering_options import LoweringOptions
from tflite_tools import runtime
from tflite_tools.model.builder import ModelBuilder, quantization

rng = np.random.default_rng(11)


# Int8 ops take ARM's forms (SDOT on signed activations, SQRDMULH requantization) or x86's (VNNI on
# uint8-shifted activations, 64-bit requantizing products), and requantize convolutions and matrix
# products as the reference kernels do or in float32 as XNNPACK does (x86's default): every int8 test
# runs each (x86_forms, int8_rounding) pair here.
FORMS = ((False, "reference"), (True, "reference"), (True, "xnnpack"))
REFERENCE_FORMS = tuple(f for f in FORMS if f[1] == "reference")

# The ops whose requantization the "xnnpack" rounding changes (lower.quantized._int8_arithmetic).
REQUANTIZED_SUMS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV"}


def halide(model, inputs, x86_forms: bool = False, target=None, rounding: str = "reference",
           wide_integers: bool = True):
    sg = model.main
    options = LoweringOptions(x86_integer=x86_forms, int8_rounding=rounding, wide_integers=wide_integers)
    jit = JitKernel(build_block("block", sg.operators, sg.outputs, options), target=target)
    return jit(jit.inputs_from({id(t): a for t, a in zip(sg.inputs, inputs)}))


def exact_resolver(model, rounding: str) -> str:
    """The LiteRT kernels a form's outputs must equal bit for bit: XNNPACK's where the model's sums
    are requantized as XNNPACK does, else the reference kernels."""
    ops = {op.name for op in model.main.operators}
    return "xnnpack" if rounding == "xnnpack" and ops & REQUANTIZED_SUMS else "reference"


def check(model, exact: bool, seeds=(0, 1)) -> None:
    """Asserts the int8 outputs: within 1 LSB of the builtin kernels, and when `exact` equal to
    the reference kernels (XNNPACK's, for sums requantized as XNNPACK does)."""
    data = tflite_tools.serialize(model)
    for seed, (x86_forms, rounding) in itertools.product(seeds, FORMS):
        builtin = runtime.make_interpreter(data, resolver="builtin")
        inputs = runtime.random_inputs(builtin, seed)
        got = halide(model, inputs, x86_forms, rounding=rounding)
        for ref, out in zip(runtime.run(builtin, inputs), got):
            assert out.dtype == np.int8 and ref.shape == out.shape
            diff = np.abs(ref.astype(np.int32) - out.astype(np.int32))
            assert diff.max() <= 1, f"{int((diff > 1).sum())} elements more than 1 LSB off ({rounding})"
            assert len(np.unique(ref)) > 3, "outputs saturated: the test's scales say nothing"
        if exact:
            resolver = exact_resolver(model, rounding)
            for ref, out in zip(runtime.run(runtime.make_interpreter(data, resolver=resolver), inputs), got):
                assert np.array_equal(ref, out), f"{int((ref != out).sum())} elements differ from {resolver}'s"


def int8_weights(*shape):
    return rng.integers(-127, 128, shape).astype(np.int8)


def out_scale(in_scale: float, w_scale: float, taps: int) -> float:
    """An output scale that puts a sum of `taps` random int8 products at ~40 steps (not saturated)."""
    return in_scale * w_scale * (127 / math.sqrt(3)) ** 2 * math.sqrt(taps) / 40


def conv_model(shape, cout, k, stride, padding, act="NONE", dilation=1, depthwise=False, mult=1, weights=None,
               in_zp=-5, then=None):
    b = ModelBuilder()
    n, h, wd, cin = shape
    x = b.input("x", shape, "int8", quant=quantization(0.02, in_zp))
    cw = cin * mult if depthwise else cout
    w_scales = rng.uniform(0.002, 0.01, cw).astype(np.float32)
    if depthwise:
        w = int8_weights(1, k, k, cw) if weights is None else weights(1, k, k, cw)
        wt = b.const("w", w, quant=quantization(w_scales, 0, 3))
    else:
        wt = b.const("w", int8_weights(cw, k, k, cin), quant=quantization(w_scales, 0, 0))
    bias_scales = 0.02 * w_scales
    bias = b.const("b", rng.integers(-2000, 2000, cw).astype(np.int32), quant=quantization(bias_scales, 0, 0))
    eff = (k - 1) * dilation + 1
    oh = -(-h // stride) if padding == "SAME" else (h - eff) // stride + 1
    ow = -(-wd // stride) if padding == "SAME" else (wd - eff) // stride + 1
    taps = k * k * (1 if depthwise else cin)
    oq = quantization(out_scale(0.02, float(w_scales.mean()), taps), 3)
    if depthwise:
        y = b.op("DEPTHWISE_CONV_2D", [x, wt, bias], [n, oh, ow, cw], quant=oq, padding=padding, stride_h=stride,
                 stride_w=stride, depth_multiplier=mult, dilation_h_factor=dilation, dilation_w_factor=dilation,
                 fused_activation_function=act)
    else:
        y = b.op("CONV_2D", [x, wt, bias], [n, oh, ow, cw], quant=oq, padding=padding, stride_h=stride,
                 stride_w=stride, dilation_h_factor=dilation, dilation_w_factor=dilation, fused_activation_function=act)
    if then is not None:  # a unary int8 op on the result, at the conv's scale (a finer one would
        y = b.op(then, [y], [n, oh, ow, cw], quant=oq)  # magnify the builtin conv's 1-LSB steps)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("shape, cout, k, stride, padding, act, dilation", [
    ((1, 9, 9, 3), 17, 3, 2, "SAME", "RELU6", 1),   # the stem: stride 2, RELU6
    ((1, 7, 7, 17), 8, 1, 1, "VALID", "NONE", 1),   # a projection (1x1, no activation)
    ((1, 8, 8, 5), 7, 3, 1, "VALID", "RELU", 1),
    ((1, 9, 9, 4), 6, 3, 1, "SAME", "NONE", 2),     # dilation
    ((1, 1, 1, 33), 20, 1, 1, "SAME", "NONE", 1),   # one pixel (tile-blocked weights)
    # Input channels in groups of 4: dot-product sums (raw int8 products, zero point in the bias)
    ((1, 6, 7, 8), 20, 3, 1, "SAME", "RELU6", 1),   # padded taps must still add nothing
    ((1, 7, 5, 16), 36, 1, 1, "VALID", "NONE", 1),  # pointwise, channels past one tile
    ((1, 9, 9, 12), 6, 3, 2, "SAME", "RELU", 2),    # strided, dilated
    ((1, 1, 1, 32), 20, 1, 1, "SAME", "NONE", 1),   # one pixel
    # Fewer input channels: dot-product groups along each filter row's kw x cin input bytes
    ((1, 5, 7, 6), 16, 1, 1, "VALID", "NONE", 1),   # pointwise: each pixel's 6 bytes and 2 of the next
    ((1, 8, 9, 3), 12, 5, 1, "SAME", "RELU", 1),    # 15 taps a row, in 4 groups
    ((1, 9, 9, 3), 8, 3, 1, "SAME", "NONE", 2),     # dilated: no row runs, single products
])
def test_conv2d_int8(shape, cout, k, stride, padding, act, dilation):
    check(conv_model(shape, cout, k, stride, padding, act, dilation), exact=True)


@pytest.mark.parametrize("shape, k, stride, padding, mult, act", [
    ((1, 9, 9, 17), 3, 1, "SAME", 1, "RELU6"),
    ((1, 8, 8, 4), 3, 2, "VALID", 2, "NONE"),
    ((1, 10, 10, 16), 3, 2, "SAME", 1, "RELU6"),
    # Taps summed two at a time in int16: an even count, an odd one past a tile of channels
    ((1, 6, 6, 24), 2, 1, "VALID", 1, "NONE"),
    ((1, 9, 8, 40), 5, 1, "SAME", 1, "RELU"),
])
def test_depthwise_int8(shape, k, stride, padding, mult, act):
    check(conv_model(shape, None, k, stride, padding, act, depthwise=True, mult=mult), exact=True)


@pytest.mark.parametrize("extreme", ["-127", "-128"])
def test_depthwise_int8_products_at_the_int16_limit(extreme):
    # Taps paired in int16 hold 2 * 128 * 127; every weight at -127 against inputs at -128 (zero
    # point 127: all taps of the padding too) reaches it. A weight of -128 could overflow a pair, so
    # such weights take the single-tap form (and the "tap_sums" packer refuses them).
    low = int(extreme)

    def weights(*shape):
        w = int8_weights(*shape)
        w[..., ::2] = low  # half the channels at the limit, the rest random: outputs stay varied
        return w

    model = conv_model((1, 6, 6, 16), None, 3, 1, "SAME", depthwise=True, weights=weights, in_zp=127)
    data = tflite_tools.serialize(model)
    builtin = runtime.make_interpreter(data, resolver="builtin")
    inputs = [np.full(i.shape, -128, np.int8) if k == 0 else i for k, i in enumerate(runtime.random_inputs(builtin, 0))]
    inputs[0][0, 2:4, 2:4, :] = 100  # some contrast, so the outputs are not one value
    for x86_forms, rounding in FORMS:
        resolver = exact_resolver(model, rounding)
        expected = runtime.run(runtime.make_interpreter(data, resolver=resolver), inputs)
        for ref, out in zip(expected, halide(model, inputs, x86_forms, rounding=rounding)):
            assert np.array_equal(ref, out), f"{int((ref != out).sum())} elements differ from {resolver}'s"


def fully_connected_model(rows: int, depth: int, units: int):
    """An int8 FULLY_CONNECTED [rows, depth] -> [rows, units], per-channel weights, with a bias."""
    b = ModelBuilder()
    x = b.input("x", (rows, depth), "int8", quant=quantization(0.03, 7))
    w_scales = rng.uniform(0.002, 0.01, units).astype(np.float32)
    wt = b.const("w", int8_weights(units, depth), quant=quantization(w_scales, 0, 0))
    bias = b.const("b", rng.integers(-500, 500, units).astype(np.int32), quant=quantization(0.03 * w_scales, 0, 0))
    b.output(b.op("FULLY_CONNECTED", [x, wt, bias], [rows, units],
                  quant=quantization(out_scale(0.03, float(w_scales.mean()), depth), -4)))
    return b.build()


def test_fully_connected_int8_per_channel_rounds_once_as_the_reference():
    # LiteRT's reference per-channel FULLY_CONNECTED rounds x * multiplier once (halves up); the
    # builtin kernel and every other op round twice, as gemmlowp does. The two differ on sums that
    # land on a half step: about 1 in 800 here, so 8,192 outputs meet several.
    check(fully_connected_model(rows=32, depth=64, units=64), exact=True, seeds=(0, 1, 2, 3))


@pytest.mark.parametrize("in_shape, units, per_channel, bias, keep", [
    ((2, 17), 10, False, True, False),
    ((1, 33), 16, True, False, False),   # the classifier: per-channel, no bias
    ((1, 4, 6), 5, True, True, True),
    ((3, 32), 40, True, True, False),    # depth in groups of 4: dot-product sums
    ((1, 64), 10, False, True, False),   # one row
    ((1, 5, 16), 7, True, False, True),
])
def test_fully_connected_int8(in_shape, units, per_channel, bias, keep):
    b = ModelBuilder()
    depth = in_shape[-1]
    x = b.input("x", in_shape, "int8", quant=quantization(0.03, 7))
    w_scales = rng.uniform(0.002, 0.01, units if per_channel else 1).astype(np.float32)
    wt = b.const("w", int8_weights(units, depth), quant=quantization(w_scales, 0, 0))
    inputs = [x, wt, b.const("b", rng.integers(-500, 500, units).astype(np.int32),
                             quant=quantization(0.03 * w_scales, 0, 0)) if bias else None]
    out = list(in_shape[:-1]) + [units] if keep else [int(np.prod(in_shape[:-1])), units]
    b.output(b.op("FULLY_CONNECTED", inputs, out, quant=quantization(out_scale(0.03, float(w_scales.mean()), depth), -4),
                  keep_num_dims=keep))
    check(b.build(), exact=True)


@pytest.mark.parametrize("a_shape, b_shape, act", [
    ((1, 4, 4, 8), (1, 4, 4, 8), "NONE"),
    ((1, 3, 5, 17), (17,), "RELU"),       # broadcasting
    ((2, 7), (2, 7), "RELU6"),
])
@pytest.mark.parametrize("op, scale", [("ADD", 0.06), ("SUB", 0.06), ("MUL", 0.08)])
def test_binary_int8(op, scale, a_shape, b_shape, act):
    b = ModelBuilder()
    x = b.input("x", a_shape, "int8", quant=quantization(0.05, -3))
    y = b.input("y", b_shape, "int8", quant=quantization(0.02, 6))
    out = tuple(np.broadcast_shapes(a_shape, b_shape))
    b.output(b.op(op, [x, y], out, quant=quantization(scale, 2), fused_activation_function=act))
    check(b.build(), exact=True)


@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize("scales", [(0.02, 0.05), (0.03, 0.03), (0.05, 0.0049), (0.05, 1e-12)])
def test_add_int8_rescales_either_input_exactly(op, scales):
    # The larger-scale input's multiplier is 2^30 (a shift, no rounding); the other's a Q31
    # multiplier and a shift, or 2^30 too when the scales are equal.
    b = ModelBuilder()
    x = b.input("x", (1, 5, 6, 24), "int8", quant=quantization(scales[0], -3))
    y = b.input("y", (1, 5, 6, 24), "int8", quant=quantization(scales[1], 6))
    b.output(b.op(op, [x, y], (1, 5, 6, 24), quant=quantization(0.06, 2)))
    check(b.build(), exact=True)


@pytest.mark.parametrize("keep, shape, out_scale", [(False, (1, 5, 5, 19), 0.01), (True, (1, 5, 5, 19), 0.01),
                                                    (True, (1, 7, 3, 4), 0.004), (True, (1, 16, 16, 19), 0.02)])
def test_mean_int8(keep, shape, out_scale):
    # Bit for bit the reference kernel: 1/N folded into the multiplier with TFLite's shifts (N = 25,
    # 21 and a power of two); a small output scale magnifies any difference in the rounding.
    b = ModelBuilder()
    x = b.input("x", shape, "int8", quant=quantization(0.04, -2))
    out = (1, 1, 1, shape[3]) if keep else (1, shape[3])
    b.output(b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], out, quant=quantization(out_scale, 1),
                  keep_dims=keep))
    check(b.build(), exact=True)


@pytest.mark.parametrize("shape", [(1, 16), (3, 37)])
def test_softmax_int8(shape):
    b = ModelBuilder()
    x = b.input("x", shape, "int8", quant=quantization(0.05, -1))
    b.output(b.op("SOFTMAX", [x], shape, quant=quantization(1 / 256, -128), beta=1.0))
    check(b.build(), exact=False)


def test_int8_movement_keeps_the_bytes():
    b = ModelBuilder()
    q = quantization(0.1, 4)
    x = b.input("x", (1, 4, 6), "int8", quant=q)
    b.output(b.op("RESHAPE", [x, b.const("shape", np.array([1, 24], np.int32))], (1, 24), quant=q, new_shape=[1, 24]))
    model = b.build()
    inputs = runtime.random_inputs(runtime.make_interpreter(tflite_tools.serialize(model), resolver="builtin"), 0)
    (got,) = halide(model, inputs)
    assert np.array_equal(got, inputs[0].reshape(1, 24))


def test_int8_op_without_a_lowering_is_refused():
    b = ModelBuilder()
    x = b.input("x", (1, 8), "int8", quant=quantization(0.1, 0))
    y = b.input("y", (1, 8), "int8", quant=quantization(0.1, 0))
    b.output(b.op("MAXIMUM", [x, y], (1, 8), quant=quantization(0.1, 0)))
    with pytest.raises(LoweringError, match="no int8 Halide lowering for MAXIMUM"):
        build_block("b", b.build().main.operators, b.build().main.outputs)


@pytest.mark.parametrize("real, expected", [
    (0.5, (1 << 30, 0)),
    (0.75, (3 << 29, 0)),
    (1.0, (1 << 30, 1)),
    (2.0 ** -40, (0, 0)),                        # below TFLite's range: zero
    (0.1, (round(0.8 * 2 ** 31), -3)),
])
def test_quantize_multiplier_is_tflites(real, expected):
    assert quantize_multiplier(real) == expected


@pytest.mark.parametrize("target, sdot", [("arm64-linux", True), ("arm64-linux-nodot", False)])
def test_int8_sums_use_arm_dot_product_instructions(target, sdot, tmp_path):
    # A pointwise conv and a matrix product over input channels in groups of 4: on ARMv8.2 each
    # group of int8 products is one lane of an SDOT; the -nodot target must not emit it.
    from halide_gen.aot import compile_kernel

    for model in (conv_model((1, 8, 8, 16), 32, 1, 1, "VALID"), conv_model((1, 6, 6, 8), 16, 3, 1, "SAME")):
        sg = model.main
        art = compile_kernel(sg.operators, sg.outputs, target, cache_dir=tmp_path, emit_asm=True)
        asm = "".join(p.read_text() for p in art.extra if p.suffix == ".s")
        assert ("sdot\t" in asm) == sdot, target


@pytest.mark.parametrize("x86_forms", [False, True])
def test_xnnpack_rounding_equals_xnnpack_where_it_parts_from_the_reference(x86_forms):
    # XNNPACK (LiteRT's default CPU path) requantizes in float32 and LiteRT's reference kernels in
    # fixed point: on these sizes they part on a few outputs per seed. The "xnnpack" rounding must
    # give XNNPACK's integers there too (the float32 scale's product order, round to nearest even),
    # and stay within 1 LSB of the reference, in ARM's forms and in x86's.
    parted = 0
    for model in (conv_model((1, 12, 12, 16), 36, 1, 1, "VALID", "NONE"),
                  conv_model((1, 12, 12, 32), None, 3, 1, "SAME", "RELU6", depthwise=True)):
        data = tflite_tools.serialize(model)
        for seed in range(2):
            xnnpack = runtime.make_interpreter(data, resolver="xnnpack")
            inputs = runtime.random_inputs(xnnpack, seed)
            expected = runtime.run(xnnpack, inputs)[0]
            reference = runtime.run(runtime.make_interpreter(data, resolver="reference"), inputs)[0]
            got = halide(model, inputs, x86_forms, rounding="xnnpack")[0]
            assert np.array_equal(got, expected), int((got != expected).sum())
            assert np.abs(got.astype(np.int32) - reference).max() <= 1
            parted += int((expected != reference).sum())
    assert parted > 0, "XNNPACK and the reference agreed everywhere: the test shows nothing"


@pytest.mark.parametrize("features", ["avx-avx2-f16c-fma-sse41", "sse41"])
def test_x86_forms_are_exact_without_vnni_or_avx512(features):
    # The host library's AVX2 and baseline sub-targets run the same uint8 x int8 sums with no VNNI
    # (Halide must widen them exactly: no saturating VPMADDUBSW) and the same 64-bit requantizing
    # products with 4 or 2 lanes of them, or the same float requantization.
    import halide as hl

    target = hl.Target(f"x86-64-linux-{features}-jit")
    b = ModelBuilder()
    x, y = (b.input(n, (1, 3, 4, 20), "int8", quant=quantization(s, z)) for n, s, z in (("x", 0.05, -3), ("y", 0.02, 6)))
    b.output(b.op("ADD", [x, y], (1, 3, 4, 20), quant=quantization(0.06, 2)))
    for model in (conv_model((1, 6, 7, 8), 20, 3, 1, "SAME", "RELU6"), conv_model((1, 8, 9, 3), 12, 5, 1, "SAME"),
                  conv_model((1, 6, 6, 16), None, 3, 2, "SAME", "RELU6", depthwise=True), b.build()):
        data = tflite_tools.serialize(model)
        for rounding in ("reference", "xnnpack"):
            expected = runtime.make_interpreter(data, resolver=exact_resolver(model, rounding))
            inputs = runtime.random_inputs(expected, 3)
            got = halide(model, inputs, x86_forms=True, target=target, rounding=rounding)
            for ref, out in zip(runtime.run(expected, inputs), got):
                assert np.array_equal(ref, out), (features, rounding)


def test_int8_sums_use_vnni_on_the_hosts_avx512_vnni_subtarget(tmp_path):
    from halide_gen.aot import compile_kernel

    sg = conv_model((1, 8, 8, 16), 32, 1, 1, "VALID").main
    art = compile_kernel(sg.operators, sg.outputs, "host", cache_dir=tmp_path, emit_asm=True)
    first = sorted(p for p in art.extra if p.suffix == ".s")[0]  # sub-target 0: AVX-512 with VNNI
    assert "vpdpbusd" in first.read_text()


@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("shape, k, stride, padding, act", [
    ((1, 9, 9, 5), 3, 2, "SAME", "NONE"),    # windows clipped by the padding: fewer taps to average
    ((1, 7, 8, 16), 2, 2, "VALID", "RELU6"),
    ((2, 7, 7, 20), 7, 1, "VALID", "RELU"),  # a global pool
])
def test_pools_int8(op, shape, k, stride, padding, act):
    n, h, w, c = shape
    if padding == "VALID":
        oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    else:
        oh, ow = -(-h // stride), -(-w // stride)
    b = ModelBuilder()
    q = quantization(0.05, -3)
    x = b.input("x", shape, "int8", quant=q)
    b.output(b.op(op, [x], [n, oh, ow, c], quant=q, padding=padding, filter_height=k, filter_width=k, stride_h=stride,
                  stride_w=stride, fused_activation_function=act))
    check(b.build(), exact=True)


@pytest.mark.cross
@pytest.mark.parametrize("target", ["arm64-linux", "arm64-linux-nodot"])
def test_int8_sums_on_arm64(target, tmp_path, cross_tools):
    # NEON schedules load 16 input bytes at a time and take each SDOT's 4-byte group by lane where
    # the reduction runs over multiples of 16, depthwise convs add taps in int16 pairs over 16
    # channels at once, tables index by the input: compiled for ARM64 and run under qemu, bit for bit.
    import opcheck

    models = [conv_model((1, 7, 5, 48), 36, 1, 1, "VALID", "RELU6"),   # 3 loads of 16 bytes a pixel
              conv_model((1, 6, 7, 16), 20, 3, 1, "SAME", "NONE"),     # padded, 9 taps of 16 bytes
              conv_model((1, 6, 6, 24), 16, 1, 1, "VALID", "NONE"),    # 24: groups of 4 only
              conv_model((1, 9, 9, 3), 16, 3, 2, "SAME", "RELU6"),     # filter-row groups
              fully_connected_model(5, 64, 40), fully_connected_model(1, 96, 24),
              conv_model((1, 7, 6, 40), None, 3, 1, "SAME", "RELU6", depthwise=True),  # a partial tile
              conv_model((1, 9, 9, 16), None, 5, 2, "SAME", "NONE", depthwise=True),   # 25 taps
              conv_model((1, 6, 6, 8), None, 3, 1, "VALID", "RELU", depthwise=True, mult=2),
              conv_model((1, 6, 6, 16), 24, 1, 1, "VALID", then="HARD_SWISH"),  # a table in the epilogue
              resize_model("RESIZE_BILINEAR", (1, 5, 7, 12), (9, 16), half=True),
              transpose_conv_model("SAME", 3, 2, 4, 8)]
    for k, model in enumerate(models):
        data = tflite_tools.serialize(model)
        reference = runtime.make_interpreter(data, resolver="reference")
        inputs = runtime.random_inputs(reference, k)
        got = opcheck.aot(model, inputs, target, tmp_path / str(k))
        for ref, out in zip(runtime.run(reference, inputs), got):
            assert np.array_equal(ref, out), (k, int((ref != out).sum()))


def test_concatenation_int8():
    # TFLite's int8 CONCATENATION requires every input quantized as the output: a copy, exact.
    b = ModelBuilder()
    q = quantization(0.04, 5)
    x, y = b.input("x", (1, 4, 5, 3), "int8", quant=q), b.input("y", (1, 4, 5, 6), "int8", quant=q)
    b.output(b.op("CONCATENATION", [x, y], [1, 4, 5, 9], quant=q, axis=3))
    check(b.build(), exact=True)


def test_concatenation_of_differing_scales_int8():
    # Inputs of other scales reach an int8 CONCATENATION through a requantizing QUANTIZE (the
    # converter's form: TFLite's int8 concatenation takes one scale): one block, exact.
    b = ModelBuilder()
    q = quantization(0.04, 5)
    x = b.input("x", (1, 4, 5, 3), "int8", quant=quantization(0.013, -20))
    y = b.input("y", (1, 4, 5, 6), "int8", quant=q)
    rescaled = b.op("QUANTIZE", [x], [1, 4, 5, 3], dtype="int8", quant=q)
    b.output(b.op("CONCATENATION", [rescaled, y], [1, 4, 5, 9], quant=q, axis=3))
    check(b.build(), exact=True)


def test_dynamic_update_slice_int8():
    # An int8 KV cache updated at a run-time position (random, so clamped too): a copy, exact.
    b = ModelBuilder()
    q = quantization(0.05, -3)
    cache, token = b.input("cache", (1, 8, 2, 16), "int8", quant=q), b.input("token", (1, 1, 2, 16), "int8", quant=q)
    start = b.input("start", (4,), "int32")
    b.output(b.op("DYNAMIC_UPDATE_SLICE", [cache, token, start], [1, 8, 2, 16], quant=q))
    check(b.build(), exact=True)


@pytest.mark.parametrize("op", ["PAD", "PADV2"])
def test_pad_int8(op):
    # PAD fills with a real zero, for int8 the zero point; PADV2 with its (int8) constant.
    b = ModelBuilder()
    q = quantization(0.04, -9)
    x = b.input("x", (1, 3, 4, 8), "int8", quant=q)
    ins = [x, b.const("p", np.array([[0, 0], [1, 2], [2, 0], [0, 1]], np.int32))]
    if op == "PADV2":
        ins.append(b.const("v", np.array([17], np.int8), quant=q))
    b.output(b.op(op, ins, [1, 6, 6, 9], quant=q))
    check(b.build(), exact=True)


@pytest.mark.parametrize("op, out_q", [("LOGISTIC", (1 / 256, -128)), ("TANH", (1 / 128, 0))])  # as TFLite requires
@pytest.mark.parametrize("in_q", [(0.06, -10), (0.02, 3)])
def test_lookup_table_ops_int8(op, out_q, in_q):
    # TFLite's builtin int8 LOGISTIC and TANH read a 256-entry table; ours is filled the same way:
    # equal to the builtin kernel (and within 1 LSB of the fixed-point reference, as check() holds).
    b = ModelBuilder()
    x = b.input("x", (2, 5, 7, 16), "int8", quant=quantization(*in_q))
    b.output(b.op(op, [x], [2, 5, 7, 16], quant=quantization(*out_q)))
    model = b.build()
    check(model, exact=False)
    data = tflite_tools.serialize(model)
    builtin = runtime.make_interpreter(data, resolver="builtin")
    for seed in (0, 1):
        inputs = runtime.random_inputs(builtin, seed)
        assert np.array_equal(runtime.run(builtin, inputs)[0], halide(model, inputs)[0])


@pytest.mark.parametrize("in_q, out_q", [((0.05, -3), (0.08, 10)),    # to a coarser scale
                                         ((0.05, -3), (0.02, 0))])    # to a finer one: a left shift
def test_requantize_int8(in_q, out_q):
    b = ModelBuilder()
    x = b.input("x", (1, 4, 6, 10), "int8", quant=quantization(*in_q))
    b.output(b.op("QUANTIZE", [x], [1, 4, 6, 10], "int8", quant=quantization(*out_q)))
    check(b.build(), exact=True)


@pytest.mark.parametrize("alpha, out_q", [(0.2, (0.04, -20)), (0.01, (0.02, 5)), (1.7, (0.09, 0))])
def test_leaky_relu_int8(alpha, out_q):
    b = ModelBuilder()
    x = b.input("x", (1, 5, 6, 12), "int8", quant=quantization(0.05, 4))
    b.output(b.op("LEAKY_RELU", [x], [1, 5, 6, 12], quant=quantization(*out_q), alpha=alpha))
    check(b.build(), exact=True)


@pytest.mark.parametrize("op, options, out_q", [
    ("HARD_SWISH", {}, (0.03, -40)), ("HARD_SWISH", {}, (0.05, 7)),   # MobileNetV3's activation
    ("GELU", {"approximate": False}, (0.03, -30)), ("GELU", {"approximate": True}, (0.04, 0)),
    ("EXP", {}, (0.2, -128)), ("LOG", {}, (0.02, 20)), ("ABS", {}, (0.03, -128)), ("NEG", {}, (0.05, 3)),
    ("RELU", {}, (0.02, -128)), ("RELU6", {}, (0.03, -128)), ("RELU_N1_TO_1", {}, (0.01, 0)),
])
def test_unary_int8_by_litert_table(op, options, out_q):
    # Tables LiteRT's reference kernels fill (lower/litert_tables.py): equal to them on every input.
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 16), "int8", quant=quantization(0.05, -3))
    b.output(b.op(op, [x], [1, 8, 8, 16], quant=quantization(*out_q), **options))
    check(b.build(), exact=True)


def test_elu_int8_by_litert_table():
    # LiteRT's reference resolver has no ELU: the table comes from its builtin kernel, and equals it.
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 16), "int8", quant=quantization(0.05, -3))
    b.output(b.op("ELU", [x], [1, 8, 8, 16], quant=quantization(0.03, 30)))
    model = b.build()
    data = tflite_tools.serialize(model)
    builtin = runtime.make_interpreter(data, resolver="builtin")
    inputs = [np.arange(-128, 896).astype(np.int8).reshape(1, 8, 8, 16)]  # every int8 value, 4 times
    for x86_forms, rounding in FORMS:
        assert np.array_equal(runtime.run(builtin, inputs)[0], halide(model, inputs, x86_forms, rounding=rounding)[0])


@pytest.mark.parametrize("shape, size, align, half", [
    ((1, 5, 7, 12), (10, 14), False, False),   # 2x up
    ((1, 5, 7, 12), (9, 16), False, True),     # half-pixel centres (taps before the first pixel)
    ((1, 6, 5, 8), (11, 9), True, False),      # align corners
    ((1, 9, 8, 8), (4, 3), False, True),       # down
])
@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
def test_resize_int8(op, shape, size, align, half):
    check(resize_model(op, shape, size, align, half), exact=True)


def resize_model(op, shape, size, align=False, half=False, dtype="int8"):
    b = ModelBuilder()
    q = quantization(0.05, -3) if dtype == "int8" else quantization(3e-4, 0)
    x = b.input("x", shape, dtype, quant=q)
    out = (shape[0], *size, shape[3])
    b.output(b.op(op, [x, b.const("size", np.array(size, np.int32))], out, quant=q, align_corners=align,
                  half_pixel_centers=half))
    return b.build()


def transpose_conv_model(padding, k, stride, in_hw, out_hw, cin=6, cout=5, bias=True, act="NONE"):
    b = ModelBuilder()
    x = b.input("x", (1, in_hw, in_hw, cin), "int8", quant=quantization(0.02, -5))
    w_scales = rng.uniform(0.002, 0.01, cout).astype(np.float32)
    inputs = [b.const("shape", np.array([1, out_hw, out_hw, cout], np.int32)),
              b.const("w", int8_weights(cout, k, k, cin), quant=quantization(w_scales, 0, 0)), x]
    if bias:
        inputs.append(b.const("b", rng.integers(-2000, 2000, cout).astype(np.int32),
                              quant=quantization(0.02 * w_scales, 0, 0)))
    taps = (-(-k // stride)) ** 2 * cin
    oq = quantization(out_scale(0.02, float(w_scales.mean()), taps), 3)
    b.output(b.op("TRANSPOSE_CONV", inputs, (1, out_hw, out_hw, cout), quant=oq, padding=padding, stride_h=stride,
                  stride_w=stride, fused_activation_function=act, version=4 if act != "NONE" else 3))
    return b.build()


@pytest.mark.parametrize("padding, k, stride, in_hw, out_hw, bias, act", [
    ("VALID", 2, 2, 4, 8, True, "NONE"),     # a U-Net's 2x up-sampling
    ("SAME", 3, 2, 4, 8, False, "NONE"),
    ("VALID", 3, 1, 5, 7, True, "RELU"),
])
def test_transpose_conv_int8(padding, k, stride, in_hw, out_hw, bias, act):
    check(transpose_conv_model(padding, k, stride, in_hw, out_hw, bias=bias, act=act), exact=True)


@pytest.mark.parametrize("alpha_shape", [(12,), (1, 1, 12), (5, 6, 12)])
def test_prelu_int8(alpha_shape):
    b = ModelBuilder()
    x = b.input("x", (1, 5, 6, 12), "int8", quant=quantization(0.05, 4))
    alpha = b.const("alpha", rng.integers(-60, 100, alpha_shape).astype(np.int8), quant=quantization(0.004, -10))
    b.output(b.op("PRELU", [x, alpha], [1, 5, 6, 12], quant=quantization(0.04, -20)))
    check(b.build(), exact=True)


def test_conv_hard_swish_block_int8():
    # MobileNetV3's conv + HARD_SWISH in one int8 kernel, the table read in the conv's epilogue.
    check(conv_model((1, 9, 9, 8), 24, 3, 2, "SAME", then="HARD_SWISH"), exact=True)


def test_depthwise_weights_changed_to_minus_128_after_fuse_are_declined(tmp_path, monkeypatch, private_cache):
    # The bundle's depthwise kernel adds int8 products in int16 pairs, built for weights in
    # [-127, 127]; weights are read from the model at run time, so one edited to hold -128 after
    # fuse must leave the node to TFLite, with the reason, and the answers stay TFLite's.
    from tflite_tools.fuse import fuse
    from tflite_tools.run import run

    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(private_cache.parent))
    (tmp_path / "dw.tflite").write_bytes(tflite_tools.serialize(
        conv_model((1, 6, 6, 16), None, 3, 1, "SAME", "RELU6", depthwise=True)))
    result = fuse(tmp_path / "dw.tflite", tmp_path / "out")
    assert run(result.model, delegate=result.library, options={"claim": "all"}).claims["claimed_nodes"]

    model = tflite_tools.load(result.model)
    weights = next(t for t in model.main.tensors if t.name == "w")
    edited = np.array(weights.data)
    edited[0, 1, 1, 3] = -128
    weights.data = edited
    tflite_tools.save(model, tmp_path / "edited.tflite")
    outcome = run(tmp_path / "edited.tflite", delegate=result.library, options={"claim": "all"})
    assert outcome.ok, outcome.errors
    assert outcome.claims["claimed_nodes"] == []
    assert "-128" in outcome.claims["declined"][0]["reason"]


@pytest.mark.parametrize("a_shape, b_shape, adj_x, adj_y", [
    ((1, 2, 32, 16), (1, 2, 16, 32), False, False),   # attention scores: one matrix per head
    ((1, 2, 32, 32), (1, 2, 32, 16), False, False),   # probabilities times values
    ((2, 5, 7), (7, 3), False, False),                # a shared right operand (broadcast batch)
    ((1, 7, 5), (1, 6, 7), True, True),
])
def test_batch_matmul_int8(a_shape, b_shape, adj_x, adj_y):
    # Both operands are activations with their own zero points (the converter's attention core).
    b = ModelBuilder()
    x = b.input("x", a_shape, "int8", quant=quantization(0.03, -10))
    y = b.input("y", b_shape, "int8", quant=quantization(0.035, 4))
    rows, depth = (a_shape[-1], a_shape[-2]) if adj_x else a_shape[-2:]
    cols = b_shape[-2] if adj_y else b_shape[-1]
    lead = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    out_q = quantization(0.03 * 0.035 * (127 / math.sqrt(3)) ** 2 * math.sqrt(depth) / 40, 7)
    b.output(b.op("BATCH_MATMUL", [x, y], [*lead, rows, cols], quant=out_q, adj_x=adj_x, adj_y=adj_y))
    check(b.build(), exact=True)


@pytest.mark.parametrize("a_shape, b_shape, scales", [
    ((1, 6, 16), (1, 6, 1), (0.0008, 0.00013)),   # LayerNorm's (x - mean)^2: the mean broadcast
    ((1, 5, 7), (1, 5, 7), (0.02, 0.05)),
    ((2, 9), (9,), (0.04, 0.04)),
])
def test_squared_difference_int8(a_shape, b_shape, scales):
    b = ModelBuilder()
    x = b.input("x", a_shape, "int8", quant=quantization(scales[0], 0))
    y = b.input("y", b_shape, "int8", quant=quantization(scales[1], -17))
    out = tuple(np.broadcast_shapes(a_shape, b_shape))
    out_scale = (127 * max(scales)) ** 2 / 500
    b.output(b.op("SQUARED_DIFFERENCE", [x, y], out, quant=quantization(out_scale, -128)))
    check(b.build(), exact=True)


@pytest.mark.parametrize("op", ["RSQRT", "SQRT"])
@pytest.mark.parametrize("in_q, out_q", [((1e-5, -128), (0.12, -128)), ((0.005, -128), (0.004, -128))])
def test_roots_int8_by_litert_table(op, in_q, out_q):
    # LayerNorm's 1 / sqrt(variance): the variance's zero point at -128, every input allowed.
    if op == "SQRT":
        out_q = (math.sqrt(in_q[0] * 255) / 200, -128)
    b = ModelBuilder()
    x = b.input("x", (1, 8, 32), "int8", quant=quantization(*in_q))
    b.output(b.op(op, [x], [1, 8, 32], quant=quantization(*out_q)))
    check(b.build(), exact=True)


def test_roots_int8_answer_a_negative_input_as_zero():
    # LiteRT fails the invoke on a negative input; the table gives such an input what it gives 0.
    b = ModelBuilder()
    x = b.input("x", (1, 256), "int8", quant=quantization(0.05, -3))
    b.output(b.op("RSQRT", [x], [1, 256], quant=quantization(0.03, -100)))
    model = b.build()
    every = np.arange(-128, 128).astype(np.int8).reshape(1, -1)
    nonnegative = np.maximum(every, np.int8(-3))
    (want,) = runtime.run(runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference"), [nonnegative])
    assert np.array_equal(halide(model, [every])[0], want)
    assert np.all(want[0, :125] == want[0, 125])


# -- 16x8: int16 activations, int8 weights (lower/quantized16.py) --------------------------------

def check_16x8(model, seeds=(0, 1)) -> None:
    """Asserts int16 outputs equal LiteRT's reference kernels', in every form."""
    data = tflite_tools.serialize(model)
    reference = runtime.make_interpreter(data, resolver="reference")
    for seed, (x86_forms, rounding) in itertools.product(seeds, FORMS):
        inputs = runtime.random_inputs(reference, seed)
        for ref, out in zip(runtime.run(reference, inputs), halide(model, inputs, x86_forms, rounding=rounding)):
            assert out.dtype == np.int16 and ref.shape == out.shape
            assert len(np.unique(ref)) > min(50, ref.size // 2), "outputs saturated: the test's scales say nothing"
            assert np.array_equal(ref, out), f"{int((ref != out).sum())} elements differ from the reference"


def conv_16x8(shape, cout, k, stride, padding, act="NONE", depthwise=False, bias="int64"):
    b = ModelBuilder()
    n, h, wd, cin = shape
    x = b.input("x", shape, "int16", quant=quantization(3e-4, 0))
    w_scales = rng.uniform(0.002, 0.01, cout).astype(np.float32)
    w = int8_weights(1, k, k, cout) if depthwise else int8_weights(cout, k, k, cin)
    wt = b.const("w", w, quant=quantization(w_scales, 0, 3 if depthwise else 0))
    inputs = [x, wt]
    if bias is not None:
        dtype = np.int64 if bias == "int64" else np.int32
        inputs.append(b.const("b", rng.integers(-40000, 40000, cout).astype(dtype), dtype=bias,
                              quant=quantization(3e-4 * w_scales, 0, 0)))
    oh = -(-h // stride) if padding == "SAME" else (h - k) // stride + 1
    ow = -(-wd // stride) if padding == "SAME" else (wd - k) // stride + 1
    taps = k * k * (1 if depthwise else cin)
    # ~1000 output steps for a sum of `taps` random products: neither saturated nor too coarse.
    oq = quantization(3e-4 * float(w_scales.mean()) * 32767 / 1.7 * 127 / 1.7 * math.sqrt(taps) / 3000, 0)
    options = dict(padding=padding, stride_h=stride, stride_w=stride, fused_activation_function=act)
    if depthwise:
        y = b.op("DEPTHWISE_CONV_2D", inputs, [n, oh, ow, cout], quant=oq, depth_multiplier=cout // cin, **options)
    else:
        y = b.op("CONV_2D", inputs, [n, oh, ow, cout], quant=oq, **options)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("shape, cout, k, stride, padding, act, bias", [
    ((1, 9, 9, 3), 16, 3, 2, "SAME", "RELU", "int64"),
    ((1, 7, 7, 17), 8, 1, 1, "VALID", "NONE", "int64"),
    ((1, 8, 8, 5), 7, 3, 1, "SAME", "RELU6", "int64"),
])
def test_conv2d_16x8(shape, cout, k, stride, padding, act, bias):
    check_16x8(conv_16x8(shape, cout, k, stride, padding, act, bias=bias))


@pytest.mark.parametrize("shape, k, stride, padding", [((1, 9, 9, 8), 3, 1, "SAME"), ((1, 10, 10, 6), 3, 2, "VALID")])
def test_depthwise_16x8(shape, k, stride, padding):
    check_16x8(conv_16x8(shape, shape[3], k, stride, padding, depthwise=True))


@pytest.mark.parametrize("per_channel, bias", [(False, "int64"), (True, "int64"), (True, None)])
def test_fully_connected_16x8(per_channel, bias):
    b = ModelBuilder()
    x = b.input("x", (2, 40), "int16", quant=quantization(3e-4, 0))
    scales = rng.uniform(0.002, 0.01, 12 if per_channel else 1).astype(np.float32)
    inputs = [x, b.const("w", int8_weights(12, 40), quant=quantization(scales, 0, 0))]
    if bias:
        inputs.append(b.const("b", rng.integers(-40000, 40000, 12).astype(np.int64), dtype="int64",
                              quant=quantization(3e-4 * scales, 0, 0)))
    oq = quantization(3e-4 * float(scales.mean()) * 32767 / 1.7 * 127 / 1.7 * math.sqrt(40) / 3000, 0)
    b.output(b.op("FULLY_CONNECTED", inputs, (2, 12), quant=oq))
    check_16x8(b.build())


@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize("b_shape, act", [((1, 6, 6, 8), "NONE"), ((8,), "RELU")])
def test_add_16x8(op, b_shape, act):
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 8), "int16", quant=quantization(2e-5, 0))
    y = b.input("y", b_shape, "int16", quant=quantization(3.4e-5, 0))
    b.output(b.op(op, [x, y], (1, 6, 6, 8), quant=quantization(5e-5, 0), fused_activation_function=act,
                  pot_scale_int16=False))
    check_16x8(b.build())


def test_16x8_conv_with_an_int32_bias_is_refused():
    # LiteRT 2.3's 16x8 convolution saturates every output with an int32 bias: left to it.
    model = conv_16x8((1, 6, 6, 4), 4, 3, 1, "SAME", bias="int32")
    with pytest.raises(LoweringError, match="16x8 with a INT32 bias"):
        build_block("b", model.main.operators, model.main.outputs)


def test_max_pool_16x8():
    b = ModelBuilder()
    x = b.input("x", (1, 9, 9, 8), "int16", quant=quantization(3e-5, 0))
    b.output(b.op("MAX_POOL_2D", [x], (1, 5, 5, 8), quant=quantization(3e-5, 0), padding="SAME", stride_h=2,
                  stride_w=2, filter_height=3, filter_width=3))
    check_16x8(b.build())


@pytest.mark.parametrize("op, out_scale, options", [
    ("LOGISTIC", 1 / 32768, {}), ("TANH", 1 / 32768, {}), ("GELU", 3e-4, {}), ("EXP", 3e-4, {}), ("LOG", 3e-4, {}),
    ("ABS", 3e-4, {}), ("NEG", 3e-4, {}), ("RELU", 3e-4, {}), ("RELU6", 3e-4, {}), ("LEAKY_RELU", 3e-4, {"alpha": 0.1}),
    ("SQRT", 3e-4, {}), ("RSQRT", 3e-4, {})])
def test_unary_16x8_by_litert_table(op, out_scale, options):
    # 65536-entry tables LiteRT's kernels fill: equal to them on every int16 input (SQRT and RSQRT:
    # every one LiteRT accepts).
    b = ModelBuilder()
    x = b.input("x", (1, 256, 256), "int16", quant=quantization(2e-4, 0))
    b.output(b.op(op, [x], [1, 256, 256], quant=quantization(out_scale, 0), **options))
    model = b.build()
    every = [np.arange(-32768, 32768).astype(np.int16).reshape(1, 256, 256)]
    if op in ("SQRT", "RSQRT"):
        every = [np.maximum(every[0], np.int16(1))]
    (want,) = runtime.run(runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference"), every)
    assert np.array_equal(halide(model, every)[0], want) and len(np.unique(want)) > 500


@pytest.mark.parametrize("shape, keep, out_scale", [((1, 16, 16, 12), False, 2e-5), ((1, 5, 7, 4), True, 3e-5)])
def test_mean_16x8(shape, keep, out_scale):
    b = ModelBuilder()
    x = b.input("x", shape, "int16", quant=quantization(3e-5, 0))
    out = (1, 1, 1, shape[3]) if keep else (1, shape[3])
    b.output(b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], out, quant=quantization(out_scale, 0),
                  keep_dims=keep))
    check_16x8(b.build(), seeds=(0, 1, 2))


@pytest.mark.parametrize("padding, k, stride, in_hw, out_hw, bias", [("VALID", 2, 2, 4, 8, True),
                                                                  ("SAME", 3, 2, 4, 8, False)])
def test_transpose_conv_16x8(padding, k, stride, in_hw, out_hw, bias):
    b = ModelBuilder()
    cin, cout = 6, 5
    x = b.input("x", (1, in_hw, in_hw, cin), "int16", quant=quantization(3e-4, 0))
    w_scales = rng.uniform(0.002, 0.01, cout).astype(np.float32)
    inputs = [b.const("shape", np.array([1, out_hw, out_hw, cout], np.int32)),
              b.const("w", int8_weights(cout, k, k, cin), quant=quantization(w_scales, 0, 0)), x]
    if bias:
        inputs.append(b.const("b", rng.integers(-40000, 40000, cout).astype(np.int64), dtype="int64",
                              quant=quantization(3e-4 * w_scales, 0, 0)))
    taps = (-(-k // stride)) ** 2 * cin
    oq = quantization(3e-4 * float(w_scales.mean()) * 32767 / 1.7 * 127 / 1.7 * math.sqrt(taps) / 3000, 0)
    b.output(b.op("TRANSPOSE_CONV", inputs, (1, out_hw, out_hw, cout), quant=oq, padding=padding, stride_h=stride,
                  stride_w=stride, version=3))
    check_16x8(b.build())


@pytest.mark.parametrize("shape, size, align, half", [((1, 5, 7, 12), (9, 16), False, True),
                                                     ((1, 6, 5, 8), (11, 9), True, False)])
@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
def test_resize_16x8(op, shape, size, align, half):
    # Bilinear sums of int16 taps times 2^20 weights need int64, as ResizeBilinearInteger takes them.
    check_16x8(resize_model(op, shape, size, align, half, dtype="int16"))


@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("op", ["TILE", "BROADCAST_TO"])
def test_quantized_tile_and_broadcast_copy_bytes(op, dtype):
    b = ModelBuilder()
    q = quantization(0.05, -3) if dtype == "int8" else quantization(3e-4, 0)
    x = b.input("x", (1, 3, 1, 5), dtype, quant=q)
    shape = b.const("arg", np.array([2, 1, 4, 1] if op == "TILE" else [2, 3, 4, 5], np.int32))
    b.output(b.op(op, [x, shape], (2, 3, 4, 5), quant=q, version=2 if op == "BROADCAST_TO" else 1))
    model = b.build()
    reference = runtime.make_interpreter(tflite_tools.serialize(model), resolver="builtin")
    inputs = runtime.random_inputs(reference, 0)
    assert np.array_equal(halide(model, inputs)[0], runtime.run(reference, inputs)[0])


@pytest.mark.parametrize("b_shape, act", [((1, 6, 6, 8), "NONE"), ((8,), "RELU"), ((1, 1, 6, 1), "RELU6")])
def test_mul_16x8(b_shape, act):
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 8), "int16", quant=quantization(2e-4, 0))
    y = b.input("y", b_shape, "int16", quant=quantization(3e-4, 0))
    b.output(b.op("MUL", [x, y], (1, 6, 6, 8), quant=quantization(1.5e-3, 0), fused_activation_function=act))
    check_16x8(b.build())


@pytest.mark.parametrize("padding, act", [("SAME", "NONE"), ("VALID", "RELU")])
def test_average_pool_16x8(padding, act):
    b = ModelBuilder()
    x = b.input("x", (1, 9, 9, 8), "int16", quant=quantization(3e-5, 0))
    out = (1, 5, 5, 8) if padding == "SAME" else (1, 4, 4, 8)
    b.output(b.op("AVERAGE_POOL_2D", [x], out, quant=quantization(3e-5, 0), padding=padding, stride_h=2, stride_w=2,
                  filter_height=3, filter_width=3, fused_activation_function=act))
    check_16x8(b.build())


@pytest.mark.parametrize("a_shape, b_shape, adj_x, adj_y", [((2, 5, 24), (2, 24, 7), False, False),
                                                          ((3, 4, 16), (16, 9), False, False),
                                                          ((2, 24, 5), (2, 7, 24), True, True)])
def test_batch_matmul_16x16(a_shape, b_shape, adj_x, adj_y):
    # Both operands int16 activations: products summed in 64 bits, the reduced multiplier.
    b = ModelBuilder()
    x = b.input("x", a_shape, "int16", quant=quantization(2e-4, 0))
    y = b.input("y", b_shape, "int16", quant=quantization(3e-4, 0))
    rows, cols = a_shape[-1] if adj_x else a_shape[-2], b_shape[-2] if adj_y else b_shape[-1]
    depth = a_shape[-2] if adj_x else a_shape[-1]
    out = tuple(a_shape[:-2]) + (rows, cols)
    scale = 2e-4 * 3e-4 * 32767 * 32767 / 3 * math.sqrt(depth) / 3000  # ~1000 output steps per spread
    b.output(b.op("BATCH_MATMUL", [x, y], out, quant=quantization(scale, 0), adj_x=adj_x, adj_y=adj_y))
    check_16x8(b.build())


@pytest.mark.parametrize("in_type, out_type, in_q, out_q", [
    ("int16", "int16", (3e-4, 0), (7e-4, 0)), ("int16", "int16", (3e-4, 0), (1e-4, 0)),
    ("int16", "int8", (3e-4, 0), (0.05, -3)), ("int8", "int16", (0.05, 4), (2e-4, 0))])
def test_requantize_16x8(in_type, out_type, in_q, out_q):
    # QUANTIZE between int16 scales, and between int16 and int8 (a 16x8 model's edges to int8 parts).
    b = ModelBuilder()
    x = b.input("x", (4, 300), in_type, quant=quantization(*in_q))
    b.output(b.op("QUANTIZE", [x], (4, 300), dtype=out_type, quant=quantization(*out_q)))
    model = b.build()
    reference = runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference")
    for seed in (0, 1):
        inputs = runtime.random_inputs(reference, seed)
        (want,) = runtime.run(reference, inputs)
        for wide in (True, False):
            assert np.array_equal(halide(model, inputs, wide_integers=wide)[0], want)


@pytest.mark.parametrize("shape, in_scale, beta", [((3, 7, 130), 1e-3, 1.0), ((2, 500), 2e-4, 0.7), ((6, 33), 2e-5, 2.0)])
def test_softmax_16x8(shape, in_scale, beta):
    # SoftmaxInt16's two interpolated tables and its headroom-normalised reciprocal; beta 0.7
    # checks the multiplier takes scale * beta in float as softmax.cc does.
    b = ModelBuilder()
    x = b.input("x", shape, "int16", quant=quantization(in_scale, 0))
    b.output(b.op("SOFTMAX", [x], shape, quant=quantization(1 / 32768, 0), beta=beta))
    check_16x8(b.build())


def test_softmax_16x8_on_every_reciprocal_step():
    # Rows of 5 values over spreads from one step to the whole int16 range (and rows of 2-5 equal
    # largest values): sums across the 1 / (1 + x) table's range, bit for bit in 64-bit arithmetic
    # and in the 32-bit form Vulkan's targets take.
    b = ModelBuilder()
    x = b.input("x", (4096, 5), "int16", quant=quantization(3e-4, 0))
    b.output(b.op("SOFTMAX", [x], (4096, 5), quant=quantization(1 / 32768, 0), beta=1.0))
    model = b.build()
    spreads = np.geomspace(1, 32767, 4096).astype(np.int64)[:, None]
    rows = rng.integers(-32768, 32768, (4096, 5)) % (2 * spreads) - spreads
    rows[::2, 2:] = rows[::2, :1]  # a few rows of equal values: sums of 2-5 exponentials of one
    inputs = [np.clip(rows, -32768, 32767).astype(np.int16)]
    (want,) = runtime.run(runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference"), inputs)
    for wide in (True, False):
        assert np.array_equal(halide(model, inputs, wide_integers=wide)[0], want)
    assert len(np.unique(want)) > 4000


@pytest.mark.parametrize("dtype, out_scale", [("int8", 3.6e-43), ("int16", 3.6e-43), ("int8", 0.0)])
def test_a_degenerate_output_scale_is_refused(dtype, out_scale):
    # A converter's scale for a tensor that is always zero (x - x): RELU6's bound is then beyond
    # int32 in steps (TFLite's prepare refuses it: no_integer_overflow_from_quantization), or the
    # scale is no scale at all. LoweringError (the block stays with TFLite), never an exception.
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), dtype, quant=quantization(0.02 if dtype == "int8" else 2e-4, 0))
    b.output(b.op("SUB", [x, x], (1, 4, 4, 8), quant=quantization(out_scale, 0), fused_activation_function="RELU6",
                  pot_scale_int16=False))
    model = b.build()
    with pytest.raises(LoweringError, match="scale"):
        build_block("b", model.main.operators, model.main.outputs)


def test_single_rounding_in_32_bit_pieces_equals_the_64_bit_product():
    # floor((x m + 2^(30 + down)) / 2^(31 + down)), Vulkan's form of the per-channel
    # FULLY_CONNECTED's requantization, on random and edge values of every int32 x, Q31 m and down 0-31.
    import halide as hl

    from halide_gen.lower.fixed_point import rounded_once_in_32_bits

    edges = np.array([0, 1, -1, 2, -2, 2**15, -2**15, 2**16 - 1, -2**16, 2**30, -2**30, 2**31 - 1, -2**31], np.int64)
    x = np.concatenate([rng.integers(-2**31, 2**31, 200_000), rng.integers(-2**20, 2**20, 200_000), np.repeat(edges, 500)])
    m = np.concatenate([rng.integers(2**30, 2**31, x.size - 13 * 40), np.tile([2**30, 2**31 - 1], 13 * 20)])
    down = rng.integers(0, 32, x.size)
    buffers = [hl.Buffer(np.ascontiguousarray(v.astype(np.int32))) for v in (x, m, down)]
    i = hl.Var("i")
    f = hl.Func("f")
    f[i] = rounded_once_in_32_bits(*(b[i] for b in buffers))
    got = np.asarray(f.realize([x.size]))
    total = 31 + down
    want = (x * m + (1 << (total - 1)).astype(object)) >> total.astype(object)  # Python integers: no overflow
    assert np.array_equal(got.astype(np.int64), want.astype(np.int64))


def test_requantization_without_64_bit_integers_is_exact():
    # Vulkan's targets have no 64-bit integers: the doubling high multiply takes 32-bit pieces
    # (lower.fixed_point.srdhm_in_32_bits). Run on the CPU here, every form of it must still equal
    # the reference: convolutions, ADD's rescaled inputs, MUL, MEAN, a requantizing QUANTIZE, a
    # per-channel FULLY_CONNECTED.
    models = [conv_model((1, 7, 7, 9), 8, 3, 1, "SAME", "RELU6"),
              conv_model((1, 8, 8, 8), 8, 3, 2, "SAME", depthwise=True)]
    for op in ("ADD", "MUL"):
        b = ModelBuilder()
        x, y = b.input("x", (1, 5, 6, 24), "int8", quant=quantization(0.05, -3)), b.input("y", (24,), "int8",
                                                                                        quant=quantization(0.02, 6))
        b.output(b.op(op, [x, y], (1, 5, 6, 24), quant=quantization(0.07, 2)))
        models.append(b.build())
    b = ModelBuilder()
    x = b.input("x", (1, 5, 5, 19), "int8", quant=quantization(0.04, -2))
    mean = b.op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], (1, 19), quant=quantization(0.01, 1))
    b.output(b.op("QUANTIZE", [mean], (1, 19), dtype="int8", quant=quantization(0.013, -7)))
    models.append(b.build())
    models.append(fully_connected_model(3, 40, 24))  # per channel: one rounding (rounded_once_in_32_bits)
    for model in models:
        reference = runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference")
        for seed in (0, 1, 2):
            inputs = runtime.random_inputs(reference, seed)
            for ref, out in zip(runtime.run(reference, inputs), halide(model, inputs, wide_integers=False)):
                assert np.array_equal(ref, out), [op.name for op in model.main.operators]
