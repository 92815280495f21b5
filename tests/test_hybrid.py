"""Dynamic-range ("hybrid") ops against LiteRT's reference kernels: a float input, int8 constant
weights (per tensor or per channel), the input quantized per row as the kernel runs (symmetric or
asymmetric), int32 sums rescaled to float. The quantization is TFLite's to the bit, so the outputs
agree to float32 rounding of the rescale (opcheck.FLOAT_RTOL), in every integer form (x86's VNNI
with unsigned activations, ARM's SDOT with signed ones) and without dot products (a depth that is
no multiple of 4)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import opcheck
from halide_gen.lowering_options import LoweringOptions
from tflite_tools import serialize
from tflite_tools.model.builder import ModelBuilder, quantization
from tflite_tools.model.schema import fb


def _weights(rng, units: int, depth: int, per_channel: bool, bits: int = 8):
    """int8 weights in [-127, 127] (int4: [-8, 7]) with their scales (one, or one per unit)."""
    high = 2 ** (bits - 1)
    values = rng.integers(1 - high if bits == 8 else -high, high, (units, depth)).astype(np.int8)
    scales = rng.uniform(0.002, 0.02, units) if per_channel else [0.01]
    return values, quantization(scales, 0, axis=0)


def _fc_model(in_shape, units: int, *, per_channel: bool, asymmetric: bool, bias: bool = True,
              activation: str = "NONE", keep_num_dims: bool = False, bits: int = 8):
    rng = np.random.default_rng(units * 7 + in_shape[-1])
    b = ModelBuilder()
    x = b.input("x", list(in_shape))
    values, q = _weights(rng, units, in_shape[-1], per_channel, bits)
    weights = b.const("w", values, f"int{bits}", quant=q)
    bias_t = b.const("bias", rng.standard_normal(units).astype(np.float32)) if bias else None
    rows = int(np.prod(in_shape[:-1]))
    out = [*in_shape[:-1], units] if keep_num_dims else [rows, units]
    b.output(b.op("FULLY_CONNECTED", [x, weights, bias_t], out, dtype="float32", keepNumDims=keep_num_dims,
                  asymmetricQuantizeInputs=asymmetric, fusedActivationFunction=activation))
    return b.build()


def _inputs(shape):
    # Rows of differing ranges, one all zero (its step is 1 by convention), and values that land
    # on halves of a step, where rounding half away from zero and half to even differ.
    def make(rng):
        x = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.1, 4, shape[:-1] + (1,)).astype(np.float32)
        flat = x.reshape(-1, shape[-1])
        flat[0] = 0
        if flat.shape[0] > 1:
            flat[1] = np.round(flat[1] * 2) / 2 + 0.25
            flat[1, 0] = 127 / 2  # the step is 0.5: every other element lies half a step from two
        return [x]
    return make


FORMS = [pytest.param(x86, id="x86" if x86 else "arm") for x86 in (True, False)]


@pytest.mark.parametrize("x86", FORMS)
@pytest.mark.parametrize("per_channel, asymmetric", list(itertools.product([False, True], [False, True])))
@pytest.mark.parametrize("depth", [32, 30])
def test_hybrid_fully_connected(x86, per_channel, asymmetric, depth):
    model = _fc_model((1, 5, depth), 24, per_channel=per_channel, asymmetric=asymmetric, keep_num_dims=True)
    opcheck.compare(model, _inputs((1, 5, depth)), seeds=(0, 1), options=LoweringOptions(x86_integer=x86))


@pytest.mark.parametrize("x86", FORMS)
@pytest.mark.parametrize("per_channel, asymmetric", list(itertools.product([False, True], [False, True])))
@pytest.mark.parametrize("depth", [32, 31])
def test_hybrid_fully_connected_with_int4_weights(x86, per_channel, asymmetric, depth):
    # INT4 weights, two a byte (an odd count leaves the last byte half used), which TFLite's kernels
    # unpack to int8: the same arithmetic as int8 weights from there on.
    model = _fc_model((1, 5, depth), 7, per_channel=per_channel, asymmetric=asymmetric, keep_num_dims=True, bits=4)
    assert model.main.operators[0].inputs[1].type_name == "INT4"
    opcheck.compare(model, _inputs((1, 5, depth)), seeds=(0, 1), options=LoweringOptions(x86_integer=x86))


def test_quantized_values_round_half_away_from_zero_as_tflite_rounds_them():
    # One add and a truncation (hybrid.BELOW_HALF) for TfLiteRound: the float just below a half,
    # halves, their neighbours, and random values over the int8 range, in both signs.
    import halide as hl

    from halide_gen.lower.hybrid import RowQuantization, quantized

    below = np.nextafter(np.float32(0.5), np.float32(0))
    halves = np.arange(-129, 129, dtype=np.float32) + np.float32(0.5)
    values = np.concatenate([[0, -0.0, below, -below, 1.5, 2.5, 127.49999, -128.49998], halves,
                             np.nextafter(halves, np.float32(0)), np.nextafter(halves, np.float32(200)),
                             np.random.default_rng(0).uniform(-129, 129, 4096)]).astype(np.float32)
    x, i = hl.Buffer(values), hl.Var("i")
    one = RowQuantization(lambda row: hl.f32(1), lambda row: hl.f32(1), lambda row: hl.i32(0), -128)
    f = hl.Func("rounded")
    f[i] = quantized(one, x[i], [i])
    got = np.asarray(f.realize([len(values)]))
    want = np.clip(np.copysign(np.floor(np.abs(values.astype(np.float64)) + 0.5), values), -128, 127)
    assert (got == want).all(), values[got != want]


def test_int4_values_unpack_as_tflite_packs_them():
    from tflite_tools.model.schema import pack_int4, unpack_int4
    values = np.array([-8, 7, -1, 0, 3], np.int8)
    assert pack_int4(values).tolist() == [0x78, 0x0F, 0x03]  # the first element in the low nibble
    assert unpack_int4(pack_int4(values), (5,)).tolist() == values.tolist()


@pytest.mark.parametrize("asymmetric", [False, True])
def test_a_hybrid_fully_connected_finds_each_rows_statistics_in_one_loop(asymmetric):
    # Each row's extremes, their folds, its step and zero point were stages of their own: a pass
    # over the input each, and loops on one thread between the parallel ones. Now one parallel
    # loop over the rows computes them all, a row's partial results one row's worth.
    import re

    from halide_gen.targets import target_spec
    from halide_text import scheduled_stmt

    shape = (1, 128, 192)  # work enough for threads in each
    model = _fc_model(shape, 64, per_channel=True, asymmetric=asymmetric)
    stmt = scheduled_stmt(model, options=target_spec("host").lowering_options())
    loops = re.findall(r"halide_do_par_for\(\(halide_task_t\)::(\w+),", stmt)
    statistics = [name for name in loops if "_step_" in name]
    assert len(statistics) == 1 and len(loops) == 3, loops  # the statistics, the quantized rows, the product
    body = stmt[stmt.index(f"internal func {statistics[0]}"):]
    body = body[:body.index("internal func", 1)]
    results = ["step", "inverse"] + (["zero_point"] if asymmetric else [])
    assert all(re.search(rf"fully_connected_{name}\[", body) for name in results), body
    partials = re.findall(r"allocate \w+_partial\[float32 \* (\d+)((?: \* \d+)*)\]", body)
    assert partials and all(set(rest.split(" * ")) <= {"", "1"} for _, rest in partials), partials
    opcheck.compare(model, _inputs(shape), seeds=(0, 1), options=LoweringOptions(x86_integer=True))


@pytest.mark.parametrize("asymmetric", [False, True])
def test_hybrid_fully_connected_flattens_rows_and_fuses_its_activation(asymmetric):
    model = _fc_model((2, 3, 16), 10, per_channel=True, asymmetric=asymmetric, bias=False, activation="RELU6")
    opcheck.compare(model, _inputs((2, 3, 16)), seeds=(0, 1, 2))


def _conv_model(op: str, in_shape, out_channels: int, kernel: int, *, per_channel: bool, stride: int = 1,
                padding: str = "SAME", activation: str = "NONE", dilation: int = 1):
    rng = np.random.default_rng(out_channels + kernel)
    b = ModelBuilder()
    x = b.input("x", list(in_shape))
    n, h, w_, c = in_shape
    if op == "CONV_2D":
        shape, axis, options = (out_channels, kernel, kernel, c), 0, {}
    else:
        shape, axis, options = (1, kernel, kernel, out_channels), 3, {"depthMultiplier": out_channels // c}
    values = rng.integers(-127, 128, shape).astype(np.int8)
    scales = rng.uniform(0.002, 0.02, out_channels) if per_channel else [0.01]
    weights = b.const("w", values, "int8", quant=quantization(scales, 0, axis=axis))
    bias = b.const("bias", rng.standard_normal(out_channels).astype(np.float32))
    span = dilation * (kernel - 1) + 1
    size = (-(-h // stride), -(-w_ // stride)) if padding == "SAME" else ((h - span) // stride + 1,
                                                                         (w_ - span) // stride + 1)
    b.output(b.op(op, [x, weights, bias], [n, *size, out_channels], dtype="float32", padding=padding,
                  strideH=stride, strideW=stride, dilationHFactor=dilation, dilationWFactor=dilation,
                  fusedActivationFunction=activation, **options))
    return b.build()


def _images(shape):
    def make(rng):
        x = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.5, 3, (shape[0], 1, 1, 1)).astype(np.float32)
        if shape[0] > 1:
            x[1] = np.abs(x[1])  # an image with no negative values: its zero point sits at -128
        return [x]
    return make


@pytest.mark.parametrize("x86", FORMS)
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("stride, padding", [(1, "SAME"), (2, "SAME"), (1, "VALID")])
@pytest.mark.parametrize("channels", [8, 5])
def test_hybrid_conv2d(x86, per_channel, stride, padding, channels):
    # In dot products: 8 input channels in groups of 4, 5 along the filter rows; the padding reads
    # as each image's zero point (the second image's sits at -128).
    shape = (2, 9, 7, channels)
    model = _conv_model("CONV_2D", shape, 12, 3, per_channel=per_channel, stride=stride, padding=padding,
                        activation="RELU")
    opcheck.compare(model, _images(shape), seeds=(0, 1), options=LoweringOptions(x86_integer=x86))


@pytest.mark.parametrize("target, instruction", [("host", "vpdpbusd"), ("arm64-linux", "sdot\t")])
def test_hybrid_conv2d_sums_in_the_int8_paths_dot_products(target, instruction, tmp_path):
    # Int16 sums took twice the multiplies XNNPACK's dynamic quantization does; an RGB stem (3
    # input channels) sums along its filter rows.
    from halide_gen.aot import compile_kernel

    for channels in (8, 3):
        sg = _conv_model("CONV_2D", (1, 8, 8, channels), 16, 3, per_channel=True).main
        art = compile_kernel(sg.operators, sg.outputs, target, cache_dir=tmp_path, emit_asm=True)
        asm = sorted(p for p in art.extra if p.suffix == ".s")[0]  # the host's first: AVX-512 with VNNI
        assert instruction in asm.read_text(), (target, channels)


@pytest.mark.parametrize("op, channels, per_channel", [("CONV_2D", 40, True), ("CONV_2D", 5, False),
                                                     ("DEPTHWISE_CONV_2D", 24, True)])
def test_a_hybrid_convolutions_image_statistics_read_its_rows_in_dense_vectors(op, channels, per_channel):
    # Each image's extremes were read at a flat index into it: every vector a gather whose lanes
    # each took a division (EfficientNet's 1x1 projections: 2.5-3x XNNPACK's time). Now its rows'
    # partial results come first, in dense vectors, the rows split among threads.
    import re

    from halide_gen.targets import target_spec
    from halide_text import scheduled_stmt

    shape = (2, 48, 40, channels)  # work enough for threads in the rows stage
    model = _conv_model(op, shape, channels if op == "DEPTHWISE_CONV_2D" else 16, 1, per_channel=per_channel)
    stmt = scheduled_stmt(model, options=target_spec("host").lowering_options())
    assert not re.search(r"[/%] *x\d+\(", stmt), "a vector index divides"
    loops = re.findall(r"halide_do_par_for\(\(halide_task_t\)::(\w+),", stmt)
    assert any("_rows_" in name for name in loops), loops
    opcheck.compare(model, _images(shape), seeds=(0, 1), options=target_spec("host").lowering_options())


def _expand_depthwise_model(hybrid: bool):
    """An inverted residual's expand conv (1x1, 8 -> 32 channels) and stride-2 depthwise conv, their
    weights int8 (dynamic range) or float."""
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    x = b.input("x", [1, 24, 24, 8])

    def weights(name, shape, axis):
        values = rng.integers(-127, 128, shape).astype(np.int8)
        if hybrid:
            return b.const(name, values, "int8", quant=quantization(rng.uniform(0.002, 0.02, 32), 0, axis=axis))
        return b.const(name, values.astype(np.float32) * 0.01)

    bias = b.const("bias", rng.standard_normal(32).astype(np.float32))
    expanded = b.op("CONV_2D", [x, weights("w1", (32, 1, 1, 8), 0), bias], [1, 24, 24, 32], dtype="float32",
                    padding="SAME", strideH=1, strideW=1, fusedActivationFunction="RELU6")
    b.output(b.op("DEPTHWISE_CONV_2D", [expanded, weights("w2", (1, 3, 3, 32), 3), bias], [1, 12, 12, 32],
                  dtype="float32", padding="SAME", strideH=2, strideW=2, depthMultiplier=1))
    return b.build()


def test_a_chain_with_a_hybrid_convolution_past_its_first_is_not_streamed():
    # A dynamic-range depthwise conv quantizes its input by the whole image's extremes. Streamed
    # behind the expand conv (NEON streams chains whose intermediates pass 1 MB), every strip computed
    # the expanded map again for them: EfficientNet's 112 x 112 block took 10.7x XNNPACK's ARM64
    # instructions. Such a chain is scheduled op by op; its float twin still streams.
    from halide_gen.block import build_block
    from halide_gen.schedule.conv_chain import conv_chain
    from halide_gen.targets import target_spec

    options = target_spec("arm64-linux").lowering_options()
    for hybrid in (True, False):
        ops = _expand_depthwise_model(hybrid).main.operators
        kernel = build_block("chain", ops, [ops[-1].outputs[0]], options)
        assert (conv_chain(kernel, stream_bytes=0) is None) == hybrid
    opcheck.compare(_expand_depthwise_model(True), _images((1, 24, 24, 8)), seeds=(0, 1), options=options)


@pytest.mark.parametrize("family", ["x86", "arm"])
@pytest.mark.parametrize("op", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"])
def test_a_swish_before_a_hybrid_op_is_computed_once(op, family):
    # A dynamic-range op reads its input in its row statistics and again as it quantizes it; an
    # in-block producer inlined there ran once for each (EfficientNet's swish before its hybrid
    # depthwise convs: the sigmoid three times an element, 1.5x XNNPACK's A76 cycles on the block).
    # It is realised once, as before a float reduction.
    import re

    from halide_gen.block import build_block
    from halide_gen.schedule.cpu import schedule_cpu
    from halide_gen.schedule.params import NEON, X86
    from halide_gen.targets import target_spec
    from halide_text import lowered_stmt, stable_name

    rng = np.random.default_rng(3)
    b = ModelBuilder()
    shape = [1, 24, 32] if op == "FULLY_CONNECTED" else [1, 12, 12, 16]
    x = b.input("x", shape)
    swish = b.op("MUL", [x, b.op("LOGISTIC", [x], shape)], shape)
    if op == "FULLY_CONNECTED":
        w = b.const("w", rng.integers(-127, 128, (24, 32)).astype(np.int8), "int8", quant=quantization(0.01))
        b.output(b.op(op, [swish, w, None], [1, 24, 24], dtype="float32", keepNumDims=True,
                      asymmetricQuantizeInputs=True))
    else:
        w_shape, axis = ((24, 1, 1, 16), 0) if op == "CONV_2D" else ((1, 3, 3, 16), 3)
        w = b.const("w", rng.integers(-127, 128, w_shape).astype(np.int8), "int8",
                    quant=quantization(rng.uniform(0.002, 0.02, w_shape[axis]), 0, axis=axis))
        out = [1, 12, 12, 24 if op == "CONV_2D" else 16]
        b.output(b.op(op, [swish, w, b.const("bias", np.zeros(out[-1], np.float32))], out, dtype="float32",
                      padding="SAME", strideH=1, strideW=1, **({} if op == "CONV_2D" else {"depthMultiplier": 1})))
    model = b.build()
    options = target_spec("host" if family == "x86" else "arm64-linux").lowering_options()
    ops = model.main.operators
    kernel = build_block("blk", ops, [ops[-1].outputs[0]], options)
    schedule_cpu(kernel, X86 if family == "x86" else NEON)
    name = stable_name(kernel.values[id(swish)].func)
    assert re.search(rf"produce {re.escape(name)}\b", lowered_stmt(kernel)), name
    opcheck.compare(model, lambda rng: [rng.standard_normal(shape).astype(np.float32) * 2], seeds=(0,),
                    options=options)


@pytest.mark.parametrize("per_channel", [True, False])
def test_a_hybrid_conv2d_no_dot_product_takes_sums_in_int16(per_channel):
    # Dilated along its rows over 5 input channels: neither dot-product form fits.
    model = _conv_model("CONV_2D", (2, 9, 9, 5), 12, 3, per_channel=per_channel, dilation=2)
    opcheck.compare(model, _images((2, 9, 9, 5)), seeds=(0, 1))


@pytest.mark.parametrize("x86", FORMS)
@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("lowest_weight", [-127, -128])
def test_hybrid_depthwise(x86, multiplier, stride, lowest_weight):
    # TFLite's hybrid depthwise takes per-channel weights only (its Prepare refuses one scale). Its
    # taps sum in pairs of int8 products in int16, with each image's zero point outside the map;
    # a weight of -128 could overflow that, so such weights take int16 terms instead.
    model = _conv_model("DEPTHWISE_CONV_2D", (2, 8, 6, 6), 6 * multiplier, 3, per_channel=True, stride=stride)
    weights = model.main.operators[0].inputs[1]
    weights.data = weights.data.copy()
    weights.data.flat[0] = lowest_weight
    opcheck.compare(model, _images((2, 8, 6, 6)), seeds=(0, 1), options=LoweringOptions(x86_integer=x86))


def _bfloat16_scales(rng, shape):
    """Scales in [0.01, 0.05) that bfloat16 holds exactly, as ai-edge-quantizer writes block scales
    (XNNPACK, the kernel blockwise weights are checked against, keeps them in bfloat16)."""
    wide = rng.uniform(0.01, 0.05, shape).astype(np.float32)
    return (wide.view(np.uint32) & 0xFFFF0000).view(np.float32)


def _blockwise_fc_model(in_shape, units: int, block: int, *, bias: bool, activation: str, keep_num_dims: bool,
                        asymmetric: bool):
    rng = np.random.default_rng(units + block + in_shape[-1])
    b = ModelBuilder()
    x = b.input("x", list(in_shape))
    depth = in_shape[-1]
    scales = _bfloat16_scales(rng, (units, depth // block))
    weights = b.blockwise_const("w", rng.integers(-8, 8, (units, depth)), scales, block)
    bias_t = b.const("bias", rng.standard_normal(units).astype(np.float32)) if bias else None
    out = [*in_shape[:-1], units] if keep_num_dims else [int(np.prod(in_shape[:-1])), units]
    b.output(b.op("FULLY_CONNECTED", [x, weights, bias_t], out, dtype="float32", keepNumDims=keep_num_dims,
                  asymmetricQuantizeInputs=asymmetric, fusedActivationFunction=activation))
    return b.build()


@pytest.mark.parametrize("x86", FORMS)
@pytest.mark.parametrize("in_shape, units, block, bias, activation, keep_num_dims, asymmetric", [
    ((1, 5, 64), 24, 32, True, "NONE", True, False),  # two blocks, rows kept
    ((2, 3, 128), 45, 64, False, "RELU", False, True),  # rows flattened, units no tile divides
    ((1, 256), 40, 128, True, "RELU6", False, False),  # one row (a decoder's decode step)
    ((3, 256), 16, 256, True, "NONE", True, True),  # one block spanning the row
])
def test_hybrid_fully_connected_with_weights_quantized_per_block(x86, in_shape, units, block, bias, activation,
                                                                  keep_num_dims, asymmetric):
    # ai-edge-quantizer's blockwise int4 recipe: a half-precision scale per output channel and
    # block of input channels, in a tensor the weights' quantization names. LiteRT quantizes each
    # input row asymmetrically whatever the option says; checked against XNNPACK
    # (tflite_tools.run.reference_resolver says why), to its float sums' order.
    model = _blockwise_fc_model(in_shape, units, block, bias=bias, activation=activation,
                                keep_num_dims=keep_num_dims, asymmetric=asymmetric)
    one_row = int(np.prod(in_shape[:-1])) == 1  # _inputs' first row is all zeros: random data instead
    assert opcheck.compare(model, None if one_row else _inputs(in_shape), seeds=(0, 1),
                           options=LoweringOptions(x86_integer=x86)) < 1e-5


@pytest.mark.parametrize("target, instruction", [("host", "vpdpbusd"), ("arm64-linux", "sdot\t")])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_fully_connected_quantized_per_block_sums_each_block_in_dot_products(target, instruction, rows, tmp_path):
    # Each block's int32 sums in the int8 path's dot products, then scaled in float: weights scaled
    # as they were read took 4.6x XNNPACK's time on a decoder's token.
    from halide_gen.aot import compile_kernel

    sg = _blockwise_fc_model((rows, 128), 40, 32, bias=True, activation="NONE", keep_num_dims=False,
                             asymmetric=False).main
    art = compile_kernel(sg.operators, sg.outputs, target, cache_dir=tmp_path, emit_asm=True)
    asm = sorted(p for p in art.extra if p.suffix == ".s")[0]  # the host's first: AVX-512 with VNNI
    assert instruction in asm.read_text()


def test_weights_quantized_per_block_other_than_litert_takes_them_are_left_to_tflite_with_the_reason(tmp_path,
                                                                                                     kernel_cache):
    # Scales in float32 (no converter writes them; an int4 weight times one is not exact in float32).
    from tflite_tools.fuse import fuse

    model = _blockwise_fc_model((1, 2, 64), 8, 32, bias=True, activation="NONE", keep_num_dims=True, asymmetric=False)
    scales = model.main.operators[0].inputs[1].quantization.blockwise.scales
    scales.data = scales.data.astype(np.float32)
    scales.dtype = fb.TensorType.FLOAT32
    path = tmp_path / "float32_scales.tflite"
    path.write_bytes(serialize(model))
    (record,) = fuse(path, tmp_path / "out", cache_dir=kernel_cache).kernels
    assert record.kernel is None and "in blocks of 32 with scales FLOAT32[8, 2]" in record.skipped


def _batch_matmul_model(lhs_shape, rhs_shape, *, per_channel: bool, asymmetric: bool, adj_x: bool, adj_y: bool):
    """A float left operand (`lhs_shape` as the product reads it, [.., M, K]) by int8 constant weights
    ([.., K, N]), each stored transposed where adj_x / adj_y say."""
    rng = np.random.default_rng(sum(lhs_shape) + 3 * sum(rhs_shape))
    b = ModelBuilder()
    stored = list(lhs_shape[:-2]) + ([lhs_shape[-1], lhs_shape[-2]] if adj_x else list(lhs_shape[-2:]))
    x = b.input("x", stored)
    n = rhs_shape[-1]
    weights_shape = list(rhs_shape[:-2]) + ([n, rhs_shape[-2]] if adj_y else list(rhs_shape[-2:]))
    values = rng.integers(-127, 128, weights_shape).astype(np.int8)
    scales = rng.uniform(0.002, 0.02, n) if per_channel else [0.01]
    axis = len(weights_shape) - (2 if adj_y else 1)
    weights = b.const("w", values, "int8", quant=quantization(scales, 0, axis=axis))
    batch = np.broadcast_shapes(tuple(lhs_shape[:-2]), tuple(rhs_shape[:-2]))
    b.output(b.op("BATCH_MATMUL", [x, weights], [*batch, lhs_shape[-2], n], dtype="float32", adjX=adj_x, adjY=adj_y,
                  asymmetricQuantizeInputs=asymmetric))
    return b.build(), stored


@pytest.mark.parametrize("per_channel, asymmetric", list(itertools.product([False, True], [False, True])))
@pytest.mark.parametrize("adj_x, adj_y", [(False, False), (True, True)])
@pytest.mark.parametrize("lhs_shape, rhs_shape", [((2, 5, 16), (16, 12)), ((1, 4, 8), (3, 8, 6)),
                                                  ((1, 2, 4, 8), (1, 1, 8, 6))])
def test_hybrid_batch_matmul(per_channel, asymmetric, adj_x, adj_y, lhs_shape, rhs_shape):
    # Weights shared across the batch (rank 2), a batch of weights for one input, broadcasting.
    model, stored = _batch_matmul_model(lhs_shape, rhs_shape, per_channel=per_channel, asymmetric=asymmetric,
                                        adj_x=adj_x, adj_y=adj_y)
    opcheck.compare(model, _inputs(tuple(stored)), seeds=(0, 1))


def test_a_hybrid_batch_matmul_whose_input_varies_along_two_batch_axes_is_left_to_tflite(tmp_path, private_cache):
    # TFLite's reference kernel reads other rows' scaling factors there (hybrid.py says how).
    from tflite_tools.fuse import fuse

    model, _ = _batch_matmul_model((2, 3, 4, 8), (2, 3, 8, 6), per_channel=False, asymmetric=False,
                                   adj_x=False, adj_y=False)
    path = tmp_path / "bmm.tflite"
    path.write_bytes(serialize(model))
    (record,) = fuse(path, tmp_path / "out", cache_dir=private_cache).kernels
    assert record.kernel is None and "varies along two batch axes" in record.skipped


def test_a_hybrid_batch_matmul_is_claimed_and_matches_through_the_delegate(tmp_path, private_cache):
    from tflite_tools.fuse import fuse
    from tflite_tools.run import run

    model, _ = _batch_matmul_model((2, 5, 16), (16, 12), per_channel=True, asymmetric=True, adj_x=True, adj_y=False)
    path = tmp_path / "bmm.tflite"
    path.write_bytes(serialize(model))
    result = fuse(path, tmp_path / "out", cache_dir=private_cache)
    outcome = run(result.model, delegate=result.library, options={"claim": "all"}, seed=3)
    assert outcome.ok and outcome.claims["claimed_nodes"] == [0], outcome.errors
