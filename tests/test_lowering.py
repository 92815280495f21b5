"""Every Halide lowering against LiteRT's reference kernels, with awkward sizes and every option
combination that occurs in the reference models (see opcheck.py for the tolerance and why)."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.mapping import OPS
from halide_gen.lower import LOWERINGS
from tflite_tools.model.builder import ModelBuilder
import opcheck
from opcheck import binary_model, compare, unary_model

rng = np.random.default_rng(7)


@pytest.fixture(autouse=True, params=["fp32", "fp16", "fp16-arithmetic"])
def precision(request, monkeypatch):
    """Every case three times: float32, fp16 storage (the GPU targets' --gpu-precision fp16), and fp16
    arithmetic (the ARM targets' --cpu-precision fp16)."""
    monkeypatch.setattr(opcheck, "PRECISION", request.param)
    return request.param


def w(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def i32(values):
    return np.array(values, np.int32)


def unary(op, shape=(1, 3, 5, 7), **opts):
    return unary_model(op, shape, **opts)


def binary(op, a_shape, b_shape, const_b=False, dtype="float32", out_dtype=None, **opts):
    return binary_model(op, a_shape, b_shape, w(*b_shape) if const_b else None, dtype, out_dtype, **opts)


def positive(shapes):
    return lambda r: [np.abs(r.standard_normal(s)).astype(np.float32) + 0.05 for s in shapes]


UNARY = ["ABS", "NEG", "EXP", "SQUARE", "SIN", "COS", "FLOOR", "CEIL", "ROUND", "LOGISTIC", "TANH", "RELU",
         "RELU6", "RELU_N1_TO_1", "HARD_SWISH", "ELU"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    compare(unary(op), lambda r: [r.standard_normal((1, 3, 5, 7)).astype(np.float32) * 4])


@pytest.mark.parametrize("op", ["LOG", "SQRT", "RSQRT"])
def test_unary_positive(op):
    compare(unary(op), positive([(1, 3, 5, 7)]))


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu(approximate):
    compare(unary("GELU", (1, 17, 33), approximate=approximate))


def test_leaky_relu_and_prelu():
    compare(unary("LEAKY_RELU", alpha=0.3))
    b = ModelBuilder()
    x = b.input("x", [1, 3, 5, 7])
    b.output(b.op("PRELU", [x, b.const("alpha", w(1, 1, 7))], [1, 3, 5, 7]))
    compare(b.build())


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"])
@pytest.mark.parametrize("shapes", [((1, 4, 4, 3), (1, 4, 4, 3)), ((1, 4, 4, 17), (17,)), ((2, 1, 7), (1, 5, 1))],
                         ids=["same", "channel", "both"])
def test_binary_broadcasting(op, shapes):
    compare(binary(op, *shapes))


@pytest.mark.parametrize("act", ["RELU", "RELU6", "RELU_N1_TO_1"])
def test_fused_activations(act):
    compare(binary("ADD", (1, 3, 3, 8), (8,), const_b=True, fused_activation_function=act))


def test_fused_tanh_is_not_claimed():
    # TFLite's float ADD ignores a fused TANH; the generator refuses rather than disagree.
    from halide_gen.block import build_block
    from halide_gen.lower import LoweringError

    model = binary("ADD", (1, 3, 3, 8), (8,), const_b=True, fused_activation_function="TANH")
    with pytest.raises(LoweringError, match="TANH"):
        build_block("b", model.main.operators, model.main.outputs)


def test_pow():
    compare(binary("POW", (2, 9), (2, 9)), lambda r: [np.abs(r.standard_normal((2, 9))).astype(np.float32) + 0.1,
                                                      r.standard_normal((2, 9)).astype(np.float32)])


@pytest.mark.parametrize("op", ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"])
def test_comparisons(op):
    compare(binary(op, (3, 7), (7,), out_dtype="bool"),
            lambda r: [r.integers(-2, 3, (3, 7)).astype(np.float32), r.integers(-2, 3, 7).astype(np.float32)])


def test_integer_comparison_and_logic():
    b = ModelBuilder()
    x, y = b.input("x", [4, 6], "int32"), b.input("y", [6], "int32")
    lt = b.op("LESS", [x, y], [4, 6], dtype="bool")
    ge = b.op("GREATER_EQUAL", [x, y], [4, 6], dtype="bool")
    b.output(b.op("LOGICAL_AND", [lt, b.op("LOGICAL_NOT", [ge], [4, 6])], [4, 6]),
             b.op("LOGICAL_OR", [lt, ge], [4, 6]))
    compare(b.build())


@pytest.mark.parametrize("op", ["SELECT", "SELECT_V2"])
def test_select(op):
    b = ModelBuilder()
    c, x, y = b.input("c", [3, 5], "bool"), b.input("x", [3, 5]), b.input("y", [3, 5])
    b.output(b.op(op, [c, x, y], [3, 5], dtype="float32"))
    compare(b.build())


def test_select_v2_broadcasts_like_a_causal_mask():
    b = ModelBuilder()
    c = b.const("mask", np.tril(np.ones((6, 6), bool)))
    x = b.input("x", [1, 2, 6, 6])
    b.output(b.op("SELECT_V2", [c, x, b.const("neg", np.float32(-1e9))], [1, 2, 6, 6], dtype="float32"))
    compare(b.build())


@pytest.mark.parametrize("src, dst", [("float32", "int32"), ("int32", "float32"), ("float32", "bool"), ("int32", "bool")])
def test_cast(src, dst):
    b = ModelBuilder()
    x = b.input("x", [2, 9], src)
    b.output(b.op("CAST", [x], [2, 9], dtype=dst))
    compare(b.build(), lambda r: [(r.standard_normal((2, 9)) * 5).astype(src)])


def test_quantize_dequantize():
    from tflite_tools.model.builder import quantization

    b = ModelBuilder()
    x = b.input("x", [2, 8])
    q = b.op("QUANTIZE", [x], [2, 8], dtype="int8", quant=quantization(0.05, 3))
    b.output(b.op("DEQUANTIZE", [q], [2, 8], dtype="float32"))
    compare(b.build())


def test_dequantize_per_channel_weights():
    from tflite_tools.model.builder import quantization

    b = ModelBuilder()
    wq = b.const("wq", rng.integers(-127, 128, (4, 3)).astype(np.int8), quant=quantization([0.1, 0.2, 0.05, 0.3], 0, 0))
    d = b.op("DEQUANTIZE", [wq], [4, 3], dtype="float32")
    x = b.input("x", [4, 3])
    b.output(b.op("MUL", [x, d], [4, 3]))
    compare(b.build())


def conv_model(shape, cout, k, stride, padding, act="NONE", dilation=1, groups=1):
    b = ModelBuilder()
    n, h, wd, cin = shape
    x = b.input("x", shape)
    eff = (k - 1) * dilation + 1
    oh = -(-h // stride) if padding == "SAME" else (h - eff) // stride + 1
    ow = -(-wd // stride) if padding == "SAME" else (wd - eff) // stride + 1
    y = b.op("CONV_2D", [x, b.const("w", w(cout, k, k, cin // groups)), b.const("b", w(cout))], [n, oh, ow, cout],
             padding=padding, stride_h=stride, stride_w=stride, dilation_h_factor=dilation,
             dilation_w_factor=dilation, fused_activation_function=act)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("shape, cout, k, stride, padding, act", [
    ((1, 9, 9, 3), 16, 3, 2, "SAME", "RELU6"),    # MobileNet stem
    ((1, 8, 8, 17), 7, 1, 1, "VALID", "NONE"),    # pointwise, odd channels
    ((1, 7, 11, 1), 3, 3, 1, "SAME", "RELU"),     # 1 input channel
    ((1, 10, 10, 3), 5, 3, 2, "VALID", "NONE"),
    ((2, 6, 6, 4), 4, 5, 1, "SAME", "NONE"),      # batch 2, kernel larger than stride
    ((1, 1, 1, 24), 37, 1, 1, "VALID", "RELU"),   # one pixel: squeeze-excite, weights tile-blocked
    ((1, 3, 3, 5), 40, 3, 1, "VALID", "NONE"),    # 3x3 conv down to one pixel, 40 = 32 + 8 channels
])
def test_conv2d(shape, cout, k, stride, padding, act):
    compare(conv_model(shape, cout, k, stride, padding, act))


def test_conv2d_dilated():
    compare(conv_model((1, 9, 9, 3), 4, 3, 1, "SAME", dilation=2))


def conv3d_model(shape, cout, k, strides, padding, act="NONE", dilations=(1, 1, 1), then=None):
    """A CONV_3D (a video CNN's layer: [N, D, H, W, C] in, [kd, kh, kw, Cin, Cout] filter), and
    `then`, an elementwise op on its result (C3D's RELU after each convolution)."""
    b = ModelBuilder()
    n, *spatial, cin = shape
    x = b.input("x", shape)
    out = []
    for size, kk, s, d in zip(spatial, k, strides, dilations):
        eff = (kk - 1) * d + 1
        out.append(-(-size // s) if padding == "SAME" else (size - eff) // s + 1)
    y = b.op("CONV_3D", [x, b.const("w", w(*k, cin, cout)), b.const("b", w(cout))], [n, *out, cout],
             padding=padding, stride_d=strides[0], stride_h=strides[1], stride_w=strides[2],
             dilation_d_factor=dilations[0], dilation_h_factor=dilations[1], dilation_w_factor=dilations[2],
             fused_activation_function=act)
    if then is not None:
        y = b.op(then, [y], [n, *out, cout])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("shape, cout, k, strides, padding, act, dilations, then", [
    ((1, 4, 6, 6, 3), 16, (3, 3, 3), (1, 1, 1), "SAME", "NONE", (1, 1, 1), "RELU"),  # C3D's first layer
    ((1, 5, 7, 5, 8), 7, (3, 3, 3), (2, 2, 2), "SAME", "RELU6", (1, 1, 1), None),
    ((2, 4, 5, 6, 5), 9, (2, 3, 1), (1, 2, 1), "VALID", "NONE", (1, 1, 1), None),  # batch 2, uneven kernel
    ((1, 6, 6, 6, 4), 33, (3, 3, 3), (1, 1, 1), "SAME", "RELU", (2, 1, 2), None),  # dilated, 32 + 1 channels
    ((1, 3, 3, 3, 17), 8, (1, 1, 1), (1, 1, 1), "VALID", "NONE", (1, 1, 1), "TANH"),  # pointwise
])
def test_conv3d(shape, cout, k, strides, padding, act, dilations, then):
    compare(conv3d_model(shape, cout, k, strides, padding, act, dilations, then))


@pytest.mark.parametrize("shape, cout, k, strides, padding, act, bias", [
    ((1, 2, 3, 3, 4), 5, (2, 2, 2), (2, 2, 2), "VALID", "NONE", True),   # 3-D U-Net's upsampling
    ((1, 3, 4, 3, 6), 3, (3, 3, 3), (2, 2, 2), "SAME", "RELU", True),
    ((2, 2, 3, 4, 3), 17, (3, 2, 1), (1, 2, 1), "SAME", "NONE", False),  # batch 2, uneven, no bias
    ((1, 2, 2, 2, 8), 4, (1, 3, 2), (1, 1, 3), "VALID", "RELU6", True),
    ((1, 2, 3, 3, 4), 40, (2, 2, 2), (2, 2, 2), "SAME", "NONE", True),   # two tiles of output channels
])
def test_conv3d_transpose(shape, cout, k, strides, padding, act, bias):
    compare(conv3d_transpose_model(shape, cout, k, strides, padding, act, bias))


def conv3d_transpose_model(shape, cout, k, strides, padding, act="NONE", bias=True):
    """A CONV_3D_TRANSPOSE (a 3-D U-Net's upsampling: [kd, kh, kw, Cout, Cin] filter)."""
    b = ModelBuilder()
    n, *spatial, cin = shape
    out = [size * s if padding == "SAME" else size * s + max(kk - s, 0) for size, kk, s in zip(spatial, k, strides)]
    ins = [b.const("shape", np.array([n, *out, cout], np.int32)), b.const("w", w(*k, cout, cin)), b.input("x", shape)]
    if bias:
        ins.append(b.const("b", w(cout)))
    b.output(b.op("CONV_3D_TRANSPOSE", ins, [n, *out, cout], dtype="float32", padding=padding, stride_d=strides[0],
                  stride_h=strides[1], stride_w=strides[2], fused_activation_function=act))
    return b.build()


def depthwise_model(shape, k, stride, padding, mult=1, act="NONE"):
    b = ModelBuilder()
    n, h, wd, c = shape
    x = b.input("x", shape)
    oh = -(-h // stride) if padding == "SAME" else (h - k) // stride + 1
    ow = -(-wd // stride) if padding == "SAME" else (wd - k) // stride + 1
    b.output(b.op("DEPTHWISE_CONV_2D", [x, b.const("w", w(1, k, k, c * mult)), b.const("b", w(c * mult))],
                  [n, oh, ow, c * mult], padding=padding, stride_h=stride, stride_w=stride, depth_multiplier=mult,
                  fused_activation_function=act))
    return b.build()


@pytest.mark.parametrize("shape, k, stride, padding, mult, act", [
    ((1, 9, 9, 7), 3, 1, "SAME", 1, "RELU6"),
    ((1, 10, 10, 17), 3, 2, "SAME", 1, "RELU6"),
    ((1, 8, 8, 3), 5, 2, "SAME", 1, "NONE"),
    ((1, 7, 7, 2), 3, 1, "VALID", 3, "NONE"),
])
def test_depthwise(shape, k, stride, padding, mult, act):
    compare(depthwise_model(shape, k, stride, padding, mult, act))


@pytest.mark.parametrize("padding, k, stride, in_hw, out_hw", [("VALID", 2, 2, 4, 8), ("SAME", 3, 2, 4, 8),
                                                                ("VALID", 3, 1, 5, 7)])
def test_transpose_conv(padding, k, stride, in_hw, out_hw):
    compare(transpose_conv_model(padding, k, stride, in_hw, out_hw))


def transpose_conv_model(padding, k, stride, in_hw, out_hw, cout=3):
    """A TRANSPOSE_CONV from 5 channels ([Cout, kh, kw, Cin] filter)."""
    b = ModelBuilder()
    x = b.input("x", [1, in_hw, in_hw, 5])
    y = b.op("TRANSPOSE_CONV", [b.const("shape", i32([1, out_hw, out_hw, cout])), b.const("w", w(cout, k, k, 5)), x,
                                b.const("b", w(cout))], [1, out_hw, out_hw, cout], padding=padding, stride_h=stride,
             stride_w=stride)
    b.output(y)
    return b.build()


def test_every_constant_filter_is_read_a_tile_of_output_channels_at_a_time():
    # A register tile's weights are vectors of CHANNEL_TILE output channels, one per tap and input
    # channel. Read in TFLite's layout, a filter whose output channel is not its innermost axis makes
    # each vector a gather (CONV_3D_TRANSPOSE's [kd, kh, kw, O, I]: 3.4x slower), and one whose output
    # channel is innermost but not outermost spreads a tile's vectors a whole channel count apart
    # (CONV_3D's [kd, kh, kw, I, O]: C3D's 512-channel layers, whose tile slices then map to a few of
    # the L2's sets, took 1.2-1.3x the builtin kernel's time). Every constant filter is packed so that
    # each tile of output channels holds its weights in one run, channels innermost.
    from halide_gen.block import build_block
    from halide_gen.pack import CHANNEL_TILE, PACKERS, padded

    b = ModelBuilder()
    x = b.input("x", [2, 40])
    b.output(b.op("FULLY_CONNECTED", [x, b.const("w", w(40, 40)), b.const("b", w(40))], [2, 40]))
    models = {"CONV_2D": conv_model((1, 6, 6, 5), 40, 3, 1, "SAME"),
              "CONV_3D": conv3d_model((1, 3, 4, 4, 5), 40, (3, 3, 3), (1, 1, 1), "SAME"),
              "CONV_3D_TRANSPOSE": conv3d_transpose_model((1, 2, 3, 3, 4), 40, (2, 2, 2), (2, 2, 2), "SAME"),
              "TRANSPOSE_CONV": transpose_conv_model("SAME", 3, 2, 4, 8, cout=40),
              "FULLY_CONNECTED": b.build()}
    for name, model in models.items():
        ops = model.main.operators
        (op,) = [o for o in ops if o.name == name]
        kernel = build_block("filter", ops, [ops[-1].outputs[0]])
        filters = [a for a in kernel.arguments if a.tensor is op.inputs[1]]
        assert filters and filters[0].pack, f"{name}: its filter is read as TFLite stores it"
        shape = PACKERS[filters[0].pack].shape(tuple(op.inputs[1].shape))
        assert shape[0] == padded(40) // CHANNEL_TILE and shape[-1] == CHANNEL_TILE, (name, filters[0].pack, shape)


@pytest.mark.parametrize("in_shape, out_shape, keep", [((2, 17), (2, 10), False), ((1, 4, 6), (1, 4, 3), True),
                                                        ((1, 4, 6), (4, 3), False),
                                                        ((1, 19), (1, 70), False)])  # one row: tile-blocked
def test_fully_connected(in_shape, out_shape, keep):
    b = ModelBuilder()
    x = b.input("x", in_shape)
    b.output(b.op("FULLY_CONNECTED", [x, b.const("w", w(out_shape[-1], in_shape[-1])), b.const("b", w(out_shape[-1]))],
                  out_shape, keep_num_dims=keep, fused_activation_function="RELU"))
    compare(b.build())


@pytest.mark.parametrize("a, bb, out, adj_x, adj_y", [
    ((1, 2, 5, 8), (1, 2, 8, 3), (1, 2, 5, 3), False, False),
    ((2, 8, 5), (2, 3, 8), (2, 5, 3), True, True),
    ((1, 2, 5, 8), (8, 3), (1, 2, 5, 3), False, False),
])
def test_batch_matmul(a, bb, out, adj_x, adj_y):
    b = ModelBuilder()
    x, y = b.input("x", a), b.input("y", bb)
    b.output(b.op("BATCH_MATMUL", [x, y], out, adj_x=adj_x, adj_y=adj_y))
    compare(b.build())


@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("padding, k, stride, out", [("VALID", 2, 2, 4), ("SAME", 3, 2, 5), ("SAME", 3, 1, 9)])
def test_pools(op, padding, k, stride, out):
    b = ModelBuilder()
    x = b.input("x", [1, 9, 9, 3])
    b.output(b.op(op, [x], [1, out, out, 3], padding=padding, filter_height=k, filter_width=k, stride_h=stride,
                  stride_w=stride))
    compare(b.build())


@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"])
@pytest.mark.parametrize("axes, keep, out", [([1, 2], True, (1, 1, 1, 7)), ([-1], False, (1, 3, 5)),
                                             ([0, 3], False, (3, 5))])
def test_reductions(op, axes, keep, out):
    b = ModelBuilder()
    x = b.input("x", [1, 3, 5, 7])
    b.output(b.op(op, [x, b.const("axes", i32(axes))], out, keep_dims=keep))
    scale = (lambda r: [(r.standard_normal((1, 3, 5, 7)) * 0.3 + 1).astype(np.float32)]) if op == "REDUCE_PROD" else None
    compare(b.build(), scale)


@pytest.mark.parametrize("shape", [(2, 17), (1, 4, 128)])
def test_softmax_and_log_softmax(shape):
    compare(unary("SOFTMAX", shape, beta=1.0))
    compare(unary("LOG_SOFTMAX", shape))


def test_softmax_beta_and_large_values():
    compare(unary("SOFTMAX", (3, 9), beta=0.25), lambda r: [(r.standard_normal((3, 9)) * 80).astype(np.float32)])


def test_l2_normalization():
    compare(unary("L2_NORMALIZATION", (2, 3, 17)))


@pytest.mark.parametrize("depth", [100, 197, 312, 576, 1000])
@pytest.mark.parametrize("op", ["SOFTMAX", "LOG_SOFTMAX", "MEAN", "SUM", "REDUCE_MAX", "L2_NORMALIZATION"])
def test_row_reductions_with_partials_kept_apart(op, depth):
    # x86 keeps up to 4 partials of a float row reduction apart (LoweringOptions.row_partials): each
    # its own chain of adds, folded into 16 lanes with the row's whole vectors past the last step
    # (312 = 4 x 64 + 3 x 16 + 8, 1000 = 15 x 64 + 2 x 16 + 8), then the lanes and the last elements
    # in pairs. REDUCE_MAX, which skips NaNs, folds one at a time and keeps 312's tail short (one
    # partial). The same numbers as LiteRT's over every length.
    from halide_gen.lower.reduce import partial_groups
    from halide_gen.lowering_options import LoweringOptions

    assert [partial_groups(d, 4) for d in (100, 197, 312, 576, 1000)] == [2, 4, 4, 4, 4]
    assert partial_groups(312, 4, pairwise=False) == 1 and partial_groups(1000, 4, pairwise=False) == 2
    assert partial_groups(576, 1) == 1
    if op in ("MEAN", "SUM", "REDUCE_MAX"):
        b = ModelBuilder()
        x = b.input("x", [3, depth])
        b.output(b.op(op, [x, b.const("axes", i32([1]))], [3], keep_dims=False))
        model = b.build()
    else:
        model = unary(op, (3, depth), **({"beta": 1.0} if op == "SOFTMAX" else {}))
    compare(model, options=LoweringOptions(row_partials=4))


@pytest.mark.parametrize("op", ["ARG_MAX", "ARG_MIN"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_arg_max_min(op, axis):
    b = ModelBuilder()
    x = b.input("x", [2, 5, 7])
    out = (2, 5) if axis == -1 else (2, 7)
    b.output(b.op(op, [x, b.const("axis", i32([axis]))], out, dtype="int32", output_type="INT32"))
    compare(b.build(), lambda r: [r.integers(-3, 3, (2, 5, 7)).astype(np.float32)])  # ties: first index wins


def test_reshape_squeeze_expand_dims():
    b = ModelBuilder()
    x = b.input("x", [1, 6, 4])
    r = b.op("RESHAPE", [x, b.const("s", i32([3, 8]))], [3, 8], new_shape=[3, 8])
    e = b.op("EXPAND_DIMS", [r, b.const("a", i32(1))], [3, 1, 8])
    b.output(b.op("SQUEEZE", [e], [3, 8], squeeze_dims=[1]), e)
    compare(b.build())


RESHAPES = [((1, 4, 3, 10), (1, 12, 10)), ((1, 12, 10), (1, 4, 3, 10)), ((2, 6, 5), (2, 3, 10)),
            ((1, 6, 1, 4), (24,)), ((24,), (1, 2, 1, 12)), ((2, 6), (3, 4)), ((1, 5, 1), (1, 1, 5, 1, 1))]


@pytest.mark.parametrize("in_shape, out_shape", RESHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reshape_runs_of_axes(in_shape, out_shape):
    # Axes merged, split, kept and shuffled across runs, with ones anywhere: a reshape indexes each
    # run of axes holding the same elements on its own (movement.axis_groups).
    b = ModelBuilder()
    x = b.input("x", list(in_shape))
    r = b.op("RESHAPE", [x, b.const("s", i32(out_shape))], list(out_shape), new_shape=list(out_shape))
    b.output(b.op("MUL", [r, r], list(out_shape)))
    compare(b.build())


def test_a_reshape_of_outer_axes_keeps_the_rows_vectors_dense():
    # SegFormer's LayerNorm reads [1, 16, 16, 160] as [1, 256, 160]: the offset of the whole index
    # made each of its row vectors a gather with a division per lane (2x XNNPACK's time).
    import re

    from halide_gen.targets import target_spec
    from halide_text import scheduled_stmt

    b = ModelBuilder()
    x = b.input("x", [1, 16, 16, 160])
    rows = b.op("RESHAPE", [x, b.const("s", i32([1, 256, 160]))], [1, 256, 160], new_shape=[1, 256, 160])
    mean = b.op("MEAN", [rows, b.const("axis", i32([2]))], [1, 256, 1], keep_dims=True)
    b.output(b.op("SUB", [rows, mean], [1, 256, 160]))
    stmt = scheduled_stmt(b.build(), options=target_spec("host").lowering_options())
    assert not re.search(r"[/%] *x\d+\(", stmt), "a vector index divides"
    assert "ramp(" in stmt

@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (3, 1, 0, 2), (0, 1, 2, 3)])
def test_transpose(perm):
    shape = (2, 3, 4, 5)
    b = ModelBuilder()
    x = b.input("x", shape)
    b.output(b.op("TRANSPOSE", [x, b.const("p", i32(perm))], [shape[p] for p in perm]))
    compare(b.build())


@pytest.mark.parametrize("axis", [-1, 1])
def test_concatenation(axis):
    b = ModelBuilder()
    shapes = [(1, 3, 4, 2), (1, 3, 4, 5), (1, 3, 4, 1)] if axis == -1 else [(1, 2, 4, 3), (1, 5, 4, 3)]
    xs = [b.input(f"x{k}", s) for k, s in enumerate(shapes)]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    b.output(b.op("CONCATENATION", xs, out, axis=axis))
    compare(b.build())


def test_slice_and_strided_slice():
    b = ModelBuilder()
    x = b.input("x", [2, 7, 9])
    s = b.op("SLICE", [x, b.const("b", i32([1, 2, 0])), b.const("sz", i32([1, 3, 9]))], [1, 3, 9])
    ss = b.op("STRIDED_SLICE", [x, b.const("b2", i32([0, 1, -1])), b.const("e2", i32([2, 7, 0])),
                                b.const("s2", i32([1, 2, -2]))], [2, 3, 4])
    shrink = b.op("STRIDED_SLICE", [x, b.const("b3", i32([1, 0, 0])), b.const("e3", i32([2, 7, 9])),
                                    b.const("s3", i32([1, 1, 3]))], [7, 3], shrink_axis_mask=1, end_mask=6)
    masked = b.op("STRIDED_SLICE", [x, b.const("b4", i32([1, 3, 2])), b.const("e4", i32([2, 5, 7]))
                                    , b.const("s4", i32([1, 1, 1]))], [2, 2, 5], begin_mask=1)
    b.output(s, ss, shrink, masked)
    compare(b.build())


def test_split_split_v_pack_unpack():
    b = ModelBuilder()
    x = b.input("x", [2, 6, 3])
    p, q = b.op("SPLIT", [b.const("axis", i32(1)), x], [[2, 3, 3], [2, 3, 3]], num_splits=2)
    u, v, t = b.op("SPLIT_V", [x, b.const("sizes", i32([1, 3, 2])), b.const("ax", i32(-2))],
                   [[2, 1, 3], [2, 3, 3], [2, 2, 3]], num_splits=3)
    packed = b.op("PACK", [p, q], [2, 2, 3, 3], axis=1, values_count=2)
    first, second = b.op("UNPACK", [packed], [[2, 3, 3], [2, 3, 3]], axis=1, num=2)
    b.output(u, v, t, second, first)
    compare(b.build())


@pytest.mark.parametrize("op", ["PAD", "PADV2"])
def test_pad(op):
    b = ModelBuilder()
    x = b.input("x", [1, 3, 4, 2])
    ins = [x, b.const("p", i32([[0, 0], [1, 2], [2, 0], [0, 1]]))]
    if op == "PADV2":
        ins.append(b.const("v", np.float32(-3.5)))
    b.output(b.op(op, ins, [1, 6, 6, 3]))
    compare(b.build())


@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
def test_mirror_pad(mode):
    b = ModelBuilder()
    x = b.input("x", [1, 4, 5, 2])
    b.output(b.op("MIRROR_PAD", [x, b.const("p", i32([[0, 0], [2, 1], [1, 2], [0, 0]]))], [1, 7, 8, 2], mode=mode))
    compare(b.build())


def test_tile_and_broadcast_to():
    b = ModelBuilder()
    x = b.input("x", [1, 3, 2])
    t = b.op("TILE", [x, b.const("m", i32([2, 1, 3]))], [2, 3, 6])
    bt = b.op("BROADCAST_TO", [x, b.const("s", i32([4, 3, 2]))], [4, 3, 2], version=2)  # v1 is not registered
    b.output(t, bt)
    compare(b.build())


def test_gather_embedding_and_axis():
    b = ModelBuilder()
    ids = b.input("ids", [1, 9], "int32")
    table = b.const("table", w(20, 8))
    e = b.op("GATHER", [table, ids], [1, 9, 8], axis=0, dtype="float32")
    x = b.input("x", [3, 20, 2])
    g = b.op("GATHER", [x, b.const("idx", i32([4, 0, 19]))], [3, 3, 2], axis=1)
    b.output(e, g)
    compare(b.build())


@pytest.mark.parametrize("index_type", ["int32", "int64"])
def test_dynamic_update_slice_clamps_its_start(index_type):
    # A KV cache's update: [1, 8, 2, 4] cache, one token's [1, 1, 2, 4] at a run-time position.
    # Positions past either end clamp to the last / first slot, as TFLite's kernel clamps them.
    b = ModelBuilder()
    cache, token = b.input("cache", [1, 8, 2, 4]), b.input("token", [1, 1, 2, 4])
    start = b.input("start", [4], index_type)
    b.output(b.op("DYNAMIC_UPDATE_SLICE", [cache, token, start], [1, 8, 2, 4]))
    model = b.build()
    dtype = np.int32 if index_type == "int32" else np.int64
    for position in (0, 3, 7, 8, 100, -1, -50):
        compare(model, lambda rng: [rng.standard_normal((1, 8, 2, 4)).astype(np.float32),
                                    rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
                                    np.array([0, position, 1, -2], dtype)])


def test_dynamic_update_slice_of_a_block_fused_with_its_producers():
    # The projection of the new token feeds the update; the updated cache feeds a product.
    b = ModelBuilder()
    cache, x = b.input("cache", [1, 6, 5]), b.input("x", [1, 1, 3])
    start = b.input("start", [3], "int32")
    row = b.op("FULLY_CONNECTED", [x, b.const("w", w(5, 3)), None], [1, 1, 5], keepNumDims=True)
    updated = b.op("DYNAMIC_UPDATE_SLICE", [cache, b.op("TANH", [row], [1, 1, 5]), start], [1, 6, 5])
    b.output(updated, b.op("MUL", [updated, updated], [1, 6, 5]))
    for position in (2, 9):
        compare(b.build(), lambda rng: [rng.standard_normal((1, 6, 5)).astype(np.float32),
                                        rng.standard_normal((1, 1, 3)).astype(np.float32),
                                        np.array([0, position, 0], np.int32)])


def test_gather_nd():
    b = ModelBuilder()
    x = b.input("x", [4, 5, 3])
    b.output(b.op("GATHER_ND", [x, b.const("idx", i32([[0, 1], [3, 4], [2, 0]]))], [3, 3]))
    compare(b.build())


@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
@pytest.mark.parametrize("align, half", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("size", [(7, 10), (3, 2)])
def test_resize(op, align, half, size):
    b = ModelBuilder()
    x = b.input("x", [1, 5, 4, 3])
    b.output(b.op(op, [x, b.const("size", i32(size))], [1, *size, 3], align_corners=align, half_pixel_centers=half))
    compare(b.build())


@pytest.mark.parametrize("align, half", [(False, False), (True, False), (False, True)])
def test_resize_bilinear_tables_match_the_reference_exactly(align, half):
    # Rows and columns past the 16 entries of a table's first block, 8 channels (half an AVX-512
    # vector): the per-row and per-column tables give TFLite's own source pixels and weights.
    b = ModelBuilder()
    x = b.input("x", [1, 9, 16, 8])
    b.output(b.op("RESIZE_BILINEAR", [x, b.const("size", i32((37, 64)))], [1, 37, 64, 8],
                  align_corners=align, half_pixel_centers=half))
    exact = opcheck.PRECISION == "fp32"
    assert compare(b.build(), rtol=0.0 if exact else None, seeds=(0, 1)) == 0.0 or not exact


def test_depth_to_space_and_back():
    b = ModelBuilder()
    x = b.input("x", [1, 3, 4, 8])
    d = b.op("DEPTH_TO_SPACE", [x], [1, 6, 8, 2], block_size=2)
    b.output(d, b.op("SPACE_TO_DEPTH", [d], [1, 3, 4, 8], block_size=2))
    compare(b.build())


def test_lowerings_cover_the_mapping_table():
    # The two registries (fusion's mapping table and halide_gen's lowerings) name the same ops.
    assert sorted(set(OPS) - set(LOWERINGS)) == []
    assert sorted(set(LOWERINGS) - set(OPS)) == []


def test_every_lowering_has_a_case_against_litert():
    # A lowering registered without a test would reach users unchecked: each one is named in a
    # module that runs ops against LiteRT's kernels.
    from pathlib import Path

    from halide_gen.lower.registry import QUANTIZED_LOWERINGS

    here = Path(__file__).parent
    text = "".join((here / f).read_text() for f in ("test_lowering.py", "test_lowering_int8.py",
                                                     "test_mediapipe_ops.py", "test_data_indices.py"))
    untested = [op for op in [*LOWERINGS, *QUANTIZED_LOWERINGS] if f'"{op.split(":")[-1]}"' not in text]
    assert untested == []
