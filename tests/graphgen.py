"""Random valid TFLite graphs for the fused-block fuzzer (tests/test_fuzz_blocks.py).

`graphs()` is a hypothesis strategy of `ModelBuilder` models: chains and DAGs of up to 10 ops drawn
from the lowered ops, on feature maps of random sizes (1, odd and non-vector-multiple extents
included, 1-100 channels), with SAME / VALID padding, strides, dilations, kernels of 1-7, depth
multipliers, fused activations, broadcasts against constants and against extra block inputs of
ranks 1-4, attention over a map's pixels split into heads of any size, and residual edges from any
earlier tensor (block inputs included); with `twins`, every op repeated with other constants. Every
draw goes through hypothesis, so a failing graph shrinks to a small one.

Shapes are computed here, as TFLite's kernels compute them (the builder writes what it is told and
LiteRT checks it): a graph LiteRT refuses is a bug of this module, not of the compiler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from tflite_tools.model.builder import ModelBuilder, quantization
from tflite_tools.model.ir import Model, Tensor
from twins import with_twins

ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")


@dataclass
class Graph:
    """A graph being drawn: the builder, the feature maps ops may read (rank-4 NHWC), and
    every tensor an op produced (candidates for extra graph outputs)."""

    builder: ModelBuilder
    rng: np.random.Generator
    int8: bool
    maps: list[Tensor] = field(default_factory=list)
    produced: list[Tensor] = field(default_factory=list)
    counter: int = 0

    def name(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def weights(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        """Seeded float weights scaled so sums stay near unit size."""
        fan_in = max(1, int(np.prod(shape[1:])) if len(shape) > 1 else 1)
        return (self.rng.standard_normal(shape) * scale / math.sqrt(fan_in)).astype(np.float32)

    def add(self, t: Tensor) -> Tensor:
        self.maps.append(t)
        self.produced.append(t)
        return t


# ---------------------------------------------------------------------------------------------
# Quantization: every int8 tensor gets a scale and zero point; weights are symmetric per channel.


def _q(scale: float, zero_point: int = 0):
    return quantization(float(scale), int(zero_point))


def _act_scale(t: Tensor) -> float:
    return float(t.quantization.scale[0])


def _out_quant(draw, g: Graph, magnitude: float):
    """An output quantization for a result of about `magnitude` in float: mostly a range that
    holds it, sometimes one it saturates (int8 kernels clamp as TFLite's do)."""
    steps = draw(st.sampled_from([127, 64, 200, 32]))
    return _q(max(magnitude / steps, 1e-5), draw(st.integers(-20, 20)))


def _range(t: Tensor) -> float:
    """The float magnitude an int8 tensor spans."""
    return 127 * _act_scale(t)


def _int8_weights(g: Graph, shape: tuple[int, ...], axis: int):
    """int8 weights and their per-channel quantization along `axis` (symmetric, TFLite's rule)."""
    w = g.weights(*shape, scale=1.0)
    moved = np.moveaxis(w, axis, 0).reshape(shape[axis], -1)
    scales = np.maximum(np.abs(moved).max(axis=1), 1e-3) / 127.0
    q = np.clip(np.round(w / np.expand_dims(scales, [k for k in range(len(shape)) if k != axis])), -127, 127)
    return q.astype(np.int8), quantization(scales, np.zeros(len(scales), np.int64), axis=axis)


def _bias(g: Graph, name: str, n: int, x: Tensor, wq) -> Tensor:
    if not g.int8:
        return g.builder.const(name, g.weights(n, scale=0.5))
    scales = np.asarray(wq.scale, np.float64) * _act_scale(x)
    values = np.round(g.rng.standard_normal(n) * 20).astype(np.int32)
    return g.builder.const(name, values, "int32", quantization(scales.astype(np.float32), np.zeros(n, np.int64)))


# ---------------------------------------------------------------------------------------------
# Geometry


def _out_size(size: int, kernel: int, stride: int, dilation: int, padding: str) -> int:
    effective = (kernel - 1) * dilation + 1
    if padding == "SAME":
        return -(-size // stride)
    return (size - effective) // stride + 1 if size >= effective else 0


def _window(draw, size_h: int, size_w: int, max_kernel: int = 7, dilate: bool = True):
    """(kh, kw, stride, dilation, padding) with a non-empty output."""
    kh = draw(st.integers(1, max_kernel))
    kw = draw(st.sampled_from([kh, draw(st.integers(1, max_kernel))]))
    stride = draw(st.integers(1, 3))
    dilation = draw(st.integers(1, 2)) if dilate and stride == 1 else 1
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    if _out_size(size_h, kh, stride, dilation, padding) < 1 or _out_size(size_w, kw, stride, dilation, padding) < 1:
        padding = "SAME"
    return kh, kw, stride, dilation, padding


# ---------------------------------------------------------------------------------------------
# Ops. Each draws its parameters, appends the op and returns the new feature map (or None when the
# op does not apply to the source).


def _conv(draw, g: Graph, x: Tensor, cout: int, window, depthwise: bool) -> Tensor:
    """A CONV_2D (or DEPTHWISE_CONV_2D, `cout` a multiple of the input's channels) with bias and a
    drawn fused activation; `window` = (kh, kw, stride, dilation, padding)."""
    _, h, w, cin = x.shape
    kh, kw, s, d, pad = window
    out = [1, _out_size(h, kh, s, d, pad), _out_size(w, kw, s, d, pad), cout]
    shape, axis = ((1, kh, kw, cout), 3) if depthwise else ((cout, kh, kw, cin), 0)
    b = g.builder
    if g.int8:
        wv, wq = _int8_weights(g, shape, axis)
        wt = b.const(g.name("w"), wv, "int8", wq)
        quant = _out_quant(draw, g, _range(x))  # weights of unit gain (g.weights)
    else:
        # Depthwise sums kh * kw terms, not the weights' whole fan-in.
        wt, quant = b.const(g.name("w"), g.weights(*shape) * (math.sqrt(cout) if depthwise else 1.0)), None
    bias = _bias(g, g.name("b"), cout, x, wt.quantization)  # LiteRT's reference convs require one
    options = dict(padding=pad, stride_h=s, stride_w=s, dilation_h_factor=d, dilation_w_factor=d,
                   fused_activation_function=draw(st.sampled_from(ACTIVATIONS)))
    if depthwise:
        options["depth_multiplier"] = cout // cin
    return b.op("DEPTHWISE_CONV_2D" if depthwise else "CONV_2D", [x, wt, bias], out, quant=quant, **options)


def conv_2d(draw, g: Graph, x: Tensor):
    # Sometimes whole vectors of channels: a depthwise conv after it then reads its zero padding
    # in place (schedule.cpu.padding_inlined), which ragged channel counts never do.
    cout = draw(st.one_of(st.integers(1, 12), st.sampled_from([16, 32])))
    return _conv(draw, g, x, cout, _window(draw, *x.shape[1:3]), depthwise=False)


def depthwise_conv_2d(draw, g: Graph, x: Tensor):
    return _conv(draw, g, x, x.shape[3] * draw(st.integers(1, 2)), _window(draw, *x.shape[1:3]), depthwise=True)


POINTWISE = (1, 1, 1, 1, "SAME")


def residual_block(draw, g: Graph, x: Tensor):
    """A residual block as detectors and MobileNets have it: 1x1 conv, optionally an ADD of `x`
    (a block input, often) and an activation, a padded k x k depthwise conv, a 1x1 projection back
    to `x`'s channels, the residual ADD (of `x`, or of the first ADD's result, which the block then
    reads twice), an activation."""
    c = x.shape[3]
    pre_add = draw(st.booleans())
    y = _conv(draw, g, x, c if pre_add else draw(st.integers(1, 16)), POINTWISE, depthwise=False)
    if pre_add:
        y = _add(draw, g, y, x)
    if not g.int8:
        y = unary(draw, g, y)
    residual = draw(st.sampled_from([x, y])) if pre_add else x
    k = draw(st.sampled_from([3, 5, 7]))
    d = draw(st.integers(1, 2))
    y = _conv(draw, g, y, y.shape[3], (k, k, 1, d, "SAME"), depthwise=True)
    y = _conv(draw, g, y, c, POINTWISE, depthwise=False)
    y = _add(draw, g, y, residual)
    return y if g.int8 else unary(draw, g, y)


def transpose_conv(draw, g: Graph, x: Tensor):
    _, h, w, cin = x.shape
    k = draw(st.integers(1, 4))
    s = draw(st.integers(1, 2))
    pad = draw(st.sampled_from(["SAME", "VALID"]))
    oh, ow = (h * s, w * s) if pad == "SAME" else ((h - 1) * s + k, (w - 1) * s + k)
    cout = draw(st.integers(1, 8))
    b = g.builder
    shape = b.const(g.name("shape"), np.array([1, oh, ow, cout], np.int32))
    if g.int8:
        wv, wq = _int8_weights(g, (cout, k, k, cin), 0)
        wt, quant = b.const(g.name("tw"), wv, "int8", wq), _out_quant(draw, g, _range(x))
    else:
        wt, quant = b.const(g.name("tw"), g.weights(cout, k, k, cin)), None
    inputs = [shape, wt, x]
    if draw(st.booleans()):
        inputs.append(_bias(g, g.name("tb"), cout, x, wt.quantization))
    return b.op("TRANSPOSE_CONV", inputs, [1, oh, ow, cout], version=3, padding=pad, stride_h=s, stride_w=s,
                quant=quant)


def pool(draw, g: Graph, x: Tensor):
    _, h, w, c = x.shape
    kh, kw, s, _, pad = _window(draw, h, w, max_kernel=4, dilate=False)
    kind = draw(st.sampled_from(["AVERAGE_POOL_2D", "MAX_POOL_2D"]))
    act = draw(st.sampled_from(ACTIVATIONS))
    out = [1, _out_size(h, kh, s, 1, pad), _out_size(w, kw, s, 1, pad), c]
    return g.builder.op(kind, [x], out, quant=x.quantization, padding=pad, stride_h=s, stride_w=s,
                        filter_height=kh, filter_width=kw, fused_activation_function=act)


# No EXP: after a few convolutions it overflows to inf, and what TFLite makes of inf (a fused RELU
# clamps it to FLT_MAX) is a question of TFLite's NaN and Inf semantics per op, not of fusion.
UNARY = ("RELU", "RELU6", "LOGISTIC", "TANH", "HARD_SWISH", "ABS", "NEG", "SQUARE", "RELU_N1_TO_1")


def unary(draw, g: Graph, x: Tensor):
    kind = draw(st.sampled_from(UNARY + ("LEAKY_RELU", "GELU", "PRELU")))
    b = g.builder
    if kind == "LEAKY_RELU":
        return b.op(kind, [x], x.shape, alpha=draw(st.sampled_from([0.0, 0.1, 0.2, 1.5])))
    if kind == "GELU":
        return b.op(kind, [x], x.shape, approximate=draw(st.booleans()))
    if kind == "PRELU":
        alpha_shape = draw(st.sampled_from([(x.shape[3],), (1, 1, x.shape[3]), tuple(x.shape[1:])]))
        return b.op(kind, [x, b.const(g.name("alpha"), g.weights(*alpha_shape) * 0.5)], x.shape)
    return b.op(kind, [x], x.shape)


# Int8 functions of one input that LiteRT's reference kernels compute (by table here: equal to them).
UNARY_INT8 = ("HARD_SWISH", "GELU", "ABS", "NEG", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU")


def unary_int8(draw, g: Graph, x: Tensor):
    kind = draw(st.sampled_from(UNARY_INT8 + ("PRELU",)))
    b = g.builder
    options = {"alpha": draw(st.sampled_from([0.0, 0.1, 0.2]))} if kind == "LEAKY_RELU" else {}
    quant = _out_quant(draw, g, _range(x))
    inputs = [x]
    if kind == "PRELU":
        alpha_shape = draw(st.sampled_from([(x.shape[3],), (1, 1, x.shape[3]), tuple(x.shape[1:])]))
        slopes = g.rng.integers(-40, 100, alpha_shape).astype(np.int8)
        inputs.append(b.const(g.name("alpha"), slopes, "int8", _q(0.005, draw(st.integers(-10, 10)))))
    return b.op(kind, inputs, x.shape, quant=quant, **options)


def _broadcast_operand(draw, g: Graph, x: Tensor) -> Tensor:
    """Another operand for a binary op on `x`: an earlier map of the same shape, a constant or an
    extra block input of a broadcasting shape (ranks 0-4)."""
    _, h, w, c = x.shape
    same = [t for t in g.maps if tuple(t.shape) == tuple(x.shape) and (not g.int8 or t.quantization is not None)]
    choice = draw(st.sampled_from(["map", "const", "input"] if same else ["const", "input"]))
    if choice == "map":
        return draw(st.sampled_from(same))
    shape = draw(st.sampled_from([(), (c,), (1, 1, c), (1, h, w, 1), (h, 1, c), (1, 1, w, c), (1, h, w, c), (w, 1)]))
    b = g.builder
    if choice == "const" or g.int8:
        value = g.weights(*shape) if shape else np.float32(g.rng.standard_normal())
        if g.int8:
            scale = float(np.abs(value).max() or 1.0) / 100
            return b.const(g.name("k"), np.clip(np.round(value / scale), -127, 127).astype(np.int8), "int8", _q(scale))
        return b.const(g.name("k"), value)
    return b.input(g.name("in"), shape)


def _add(draw, g: Graph, x: Tensor, other: Tensor) -> Tensor:
    """x + other (broadcast), with a drawn fused activation."""
    quant = _out_quant(draw, g, _range(x) + _range(other)) if g.int8 else None
    return g.builder.op("ADD", [x, other], x.shape, quant=quant, fused_activation_function=draw(st.sampled_from(ACTIVATIONS)))


def binary(draw, g: Graph, x: Tensor):
    other = _broadcast_operand(draw, g, x)
    b = g.builder
    if g.int8:
        return _add(draw, g, x, other)
    kind = draw(st.sampled_from(["ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"]))
    swap = draw(st.booleans())
    inputs = [other, x] if swap else [x, other]
    if kind in ("ADD", "SUB", "MUL"):
        return b.op(kind, inputs, x.shape, fused_activation_function=draw(st.sampled_from(ACTIVATIONS)))
    return b.op(kind, inputs, x.shape)


def pad(draw, g: Graph, x: Tensor):
    _, h, w, c = x.shape
    mode = "PAD" if g.int8 else draw(st.sampled_from(["PAD", "REFLECT", "SYMMETRIC"]))
    limit = {"PAD": 3, "REFLECT": lambda n: n - 1, "SYMMETRIC": lambda n: n}
    pads = []
    for n in (h, w, c):
        top = limit[mode] if mode == "PAD" else min(3, limit[mode](n))
        pads.append((draw(st.integers(0, top)), draw(st.integers(0, top))))
    paddings = np.array([(0, 0)] + pads, np.int32)
    out = [1] + [n + a + bb for n, (a, bb) in zip((h, w, c), pads)]
    b = g.builder
    if mode == "PAD":
        return b.op("PAD", [x, b.const(g.name("pads"), paddings)], out, quant=x.quantization)
    return b.op("MIRROR_PAD", [x, b.const(g.name("pads"), paddings)], out, mode=mode)


def concatenation(draw, g: Graph, x: Tensor):
    axis = draw(st.sampled_from([1, 2, 3, -1]))
    k = axis % 4
    fits = [t for t in g.maps if all(t.shape[i] == x.shape[i] for i in range(4) if i != k)
            and (not g.int8 or t.quantization is not None)]
    others = draw(st.lists(st.sampled_from(fits), min_size=1, max_size=2))
    inputs = [x, *others]
    out = list(x.shape)
    out[k] = sum(t.shape[k] for t in inputs)
    if g.int8:  # one scale for all: TFLite's int8 CONCATENATION rescales otherwise
        inputs = [t for t in inputs if t.quantization is x.quantization] or [x]
        out[k] = sum(t.shape[k] for t in inputs)
        if len(inputs) == 1:
            return None
    return g.builder.op("CONCATENATION", inputs, out, quant=x.quantization, axis=axis,
                        fused_activation_function="NONE")


def reshape(draw, g: Graph, x: Tensor):
    _, h, w, c = x.shape
    total = h * w * c
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    nh = draw(st.sampled_from(divisors))
    rest = total // nh
    nw = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
    out = [1, nh, nw, rest // nw]
    b = g.builder
    return b.op("RESHAPE", [x, b.const(g.name("shape"), np.array(out, np.int32))], out, quant=x.quantization,
                new_shape=out)


def transpose(draw, g: Graph, x: Tensor):
    perm = draw(st.permutations([1, 2, 3]))
    perm = [0, *perm]
    out = [x.shape[p] for p in perm]
    b = g.builder
    return b.op("TRANSPOSE", [x, b.const(g.name("perm"), np.array(perm, np.int32))], out, quant=x.quantization)


def resize(draw, g: Graph, x: Tensor):
    _, h, w, c = x.shape
    oh, ow = draw(st.integers(1, 2 * h + 1)), draw(st.integers(1, 2 * w + 1))
    kind = draw(st.sampled_from(["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"]))
    align = draw(st.booleans())
    half = False if align else draw(st.booleans())
    b = g.builder
    return b.op(kind, [x, b.const(g.name("size"), np.array([oh, ow], np.int32))], [1, oh, ow, c],
                align_corners=align, half_pixel_centers=half, quant=x.quantization if g.int8 else None)


def strided_slice(draw, g: Graph, x: Tensor):
    begin, end, strides, out = [0], [1], [1], [1]
    for n in x.shape[1:]:
        lo = draw(st.integers(0, n - 1))
        hi = draw(st.integers(lo + 1, n))
        s = draw(st.integers(1, 2))
        begin.append(lo), end.append(hi), strides.append(s)
        out.append(-(-(hi - lo) // s))
    b = g.builder
    if all(s == 1 for s in strides) and draw(st.booleans()):
        size = [e - bb for bb, e in zip(begin, end)]
        return b.op("SLICE", [x, b.const(g.name("begin"), np.array(begin, np.int32)),
                              b.const(g.name("size"), np.array(size, np.int32))], out, quant=x.quantization)
    return b.op("STRIDED_SLICE", [x, b.const(g.name("begin"), np.array(begin, np.int32)),
                                  b.const(g.name("end"), np.array(end, np.int32)),
                                  b.const(g.name("strides"), np.array(strides, np.int32))], out, quant=x.quantization)


def space_depth(draw, g: Graph, x: Tensor):
    _, h, w, c = x.shape
    b = g.builder
    if h % 2 == 0 and w % 2 == 0 and draw(st.booleans()):
        return b.op("SPACE_TO_DEPTH", [x], [1, h // 2, w // 2, 4 * c], block_size=2)
    if c % 4 == 0:
        return b.op("DEPTH_TO_SPACE", [x], [1, 2 * h, 2 * w, c // 4], block_size=2)
    return None


def mean(draw, g: Graph, x: Tensor):
    b = g.builder
    quant = _out_quant(draw, g, _range(x) / 2) if g.int8 else None
    return b.op("MEAN", [x, b.const(g.name("axes"), np.array([1, 2], np.int32))], [1, 1, 1, x.shape[3]], quant=quant,
                keep_dims=True)


def layer_norm_ops(b: ModelBuilder, x: Tensor, gamma: np.ndarray, beta: np.ndarray, eps: float, stem: str = "ln") -> Tensor:
    """LayerNorm over the innermost axis as TFLite converters emit it: the mean, the mean of the
    squared differences from it, then x * (rsqrt(var + eps) * gamma) + (beta - mean * rsqrt(...) * gamma)."""
    shape, row = list(x.shape), list(x.shape[:-1]) + [1]
    axis = b.const(stem + "_axis", np.array([-1], np.int32))
    mean = b.op("MEAN", [x, axis], row, keep_dims=True)
    var = b.op("MEAN", [b.op("SQUARED_DIFFERENCE", [x, mean], shape), axis], row, keep_dims=True)
    inv = b.op("RSQRT", [b.op("ADD", [var, b.const(stem + "_eps", np.float32([eps]))], row)], row)
    scale = b.op("MUL", [inv, b.const(stem + "_gamma", gamma.astype(np.float32))], shape)
    shift = b.op("SUB", [b.const(stem + "_beta", beta.astype(np.float32)), b.op("MUL", [mean, scale], shape)], shape)
    return b.op("ADD", [b.op("MUL", [x, scale], shape), shift], shape)


def attention_ops(b: ModelBuilder, q: Tensor, k: Tensor, v: Tensor, mask: np.ndarray | None = None) -> Tensor:
    """Scaled dot-product attention as converters emit it, on [batch, heads, rows, depth] queries,
    keys and values: softmax(Q K^T * depth^-0.5 (+ mask)) V."""
    *lead, rows, depth = q.shape
    keys = k.shape[-2]
    scores = b.op("BATCH_MATMUL", [q, k], [*lead, rows, keys], adj_y=True)
    scaled = b.op("MUL", [scores, b.const("scale", np.float32([depth ** -0.5]))], scores.shape)
    if mask is not None:
        scaled = b.op("ADD", [scaled, b.const("mask", mask.astype(np.float32))], scores.shape)
    weights = b.op("SOFTMAX", [scaled], scores.shape, beta=1.0)
    return b.op("BATCH_MATMUL", [weights, v], [*lead, rows, v.shape[-1]])


def attention(draw, g: Graph, x: Tensor):
    """Self-attention over a map's pixels as converters emit it: the channels split into heads
    ([1, h, w, H*D] -> [1, T, H, D] -> [1, H, T, D], any H dividing them: head sizes of 1 to 100,
    primes included), keys transposed to [1, H, D, T] or read with adj_y, softmax(Q K^T) V, and the
    heads joined back into the map."""
    _, h, w, c = x.shape
    heads = draw(st.sampled_from([d for d in range(1, c + 1) if c % d == 0]))
    depth, rows = c // heads, h * w
    if heads * rows * rows > MAX_ELEMENTS:
        return None
    b = g.builder

    def moved(op: str, t: Tensor, value: list[int], shape: list[int], **options) -> Tensor:
        return b.op(op, [t, b.const(g.name(op.lower()), np.array(value, np.int32))], shape, **options)

    split = moved("RESHAPE", x, [1, rows, heads, depth], [1, rows, heads, depth], new_shape=[1, rows, heads, depth])
    q = moved("TRANSPOSE", split, [0, 2, 1, 3], [1, heads, rows, depth])
    explicit = draw(st.booleans())
    k = moved("TRANSPOSE", split, [0, 2, 3, 1], [1, heads, depth, rows]) if explicit else q
    scores = b.op("BATCH_MATMUL", [q, k], [1, heads, rows, rows], adj_y=not explicit)
    weights = b.op("SOFTMAX", [scores], scores.shape, beta=1.0)
    mixed = b.op("BATCH_MATMUL", [weights, q], [1, heads, rows, depth])
    joined = moved("TRANSPOSE", mixed, [0, 2, 1, 3], [1, rows, heads, depth])
    return moved("RESHAPE", joined, [1, h, w, c], [1, h, w, c], new_shape=[1, h, w, c])


def layer_norm(draw, g: Graph, x: Tensor):
    """A LayerNorm over the channels of each pixel (layer_norm_ops)."""
    c = x.shape[-1]
    return layer_norm_ops(g.builder, x, 1 + g.weights(c), g.weights(c), draw(st.sampled_from([1e-5, 1e-3])),
                          g.name("ln"))


def softmax(draw, g: Graph, x: Tensor):
    quant = _q(1 / 256, -128) if g.int8 else None
    return g.builder.op("SOFTMAX", [x], x.shape, quant=quant, beta=draw(st.sampled_from([1.0, 0.5])))


def fully_connected(draw, g: Graph, x: Tensor):
    """A head: the map flattened per row ([1, H*W*C] or [H*W, C]) into units, reshaped back to a map."""
    _, h, w, c = x.shape
    per_pixel = draw(st.booleans())
    depth = c if per_pixel else h * w * c
    units = draw(st.integers(1, 16))
    b = g.builder
    if g.int8:
        wv, wq = _int8_weights(g, (units, depth), 0)
        wt = b.const(g.name("fw"), wv, "int8", wq)
        quant = _out_quant(draw, g, _range(x))
    else:
        wt, quant = b.const(g.name("fw"), g.weights(units, depth)), None
    bias = _bias(g, g.name("fb"), units, x, wt.quantization) if draw(st.booleans()) or g.int8 else None
    rows = h * w if per_pixel else 1
    y = b.op("FULLY_CONNECTED", [x, wt, bias], [rows, units], quant=quant,
             fused_activation_function=draw(st.sampled_from(ACTIVATIONS)))
    out = [1, h, w, units] if per_pixel else [1, 1, 1, units]
    return b.op("RESHAPE", [y, b.const(g.name("shape"), np.array(out, np.int32))], out, quant=quant, new_shape=out)


# Convolutions and the elementwise ops around them come up three times as often as the rest: the
# blocks fusion makes are mostly those (a residual ADD of a block input in front of a padded
# depthwise convolution, streamed through row buffers, once read its input out of bounds).
_COMMON = (conv_2d, depthwise_conv_2d, unary, binary, residual_block)
FLOAT_OPS = 3 * _COMMON + (transpose_conv, pool, pad, concatenation, reshape, transpose, resize, strided_slice,
                           space_depth, mean, softmax, fully_connected, layer_norm, attention)
# Ops with int8 kernels, and the data movement that keeps one scale (claimed as float lowerings);
# pooling, padding and concatenation run on TFLite's kernels and cut blocks. Every int8 kernel here
# equals LiteRT's reference kernels bit for bit, so any difference is a bug. Not SOFTMAX: it is
# within 1 LSB only, and a later op with a finer output scale magnifies that step (tested per op).
INT8_OPS = 3 * (conv_2d, depthwise_conv_2d, binary, residual_block) + (mean, fully_connected, reshape, transpose,
                                                                      strided_slice, pool, pad, concatenation,
                                                                      unary_int8, resize, transpose_conv)

# Feature maps stay small: per-op tests and the fuzzer check lowering and scheduling, not speed.
MAX_ELEMENTS = 4096


class Drawn:
    """A drawn model, shown in hypothesis' reports as its ops and output shapes."""

    def __init__(self, model: Model):
        self.model = model

    def __repr__(self) -> str:
        return " -> ".join(f"{op.name}{list(op.outputs[0].shape)}" for op in self.model.main.operators)


@st.composite
def graphs(draw, int8: bool = False, max_ops: int = 10, twins: bool = False) -> Drawn:
    """A random valid model of 1 to `max_ops` ops (see the module docstring); with `twins`, each op
    repeated with other weights and other values of the constants its kernel bakes in
    (tests/twins.py): block shapes that repeat with differing constants."""
    seed = draw(st.integers(0, 2**16))
    g = Graph(ModelBuilder(), np.random.default_rng(seed), int8)
    # Channels: mostly few, sometimes up to 100 (primes included) on a map small enough to hold them.
    c = draw(st.one_of(st.integers(1, 12), st.integers(13, 100)))
    h = draw(st.integers(1, max(1, min(20, MAX_ELEMENTS // c))))
    w = draw(st.integers(1, max(1, min(20, MAX_ELEMENTS // (c * h)))))
    quant = _q(draw(st.sampled_from([0.02, 0.05, 0.1])), draw(st.integers(-10, 10))) if int8 else None
    g.maps.append(g.builder.input("x", [1, h, w, c], "int8" if int8 else "float32", quant=quant))
    if draw(st.booleans()):
        g.maps.append(g.builder.input("x2", [1, h, w, c], "int8" if int8 else "float32", quant=quant))
    ops = INT8_OPS if int8 else FLOAT_OPS
    n = draw(st.integers(1, max_ops))
    for _ in range(n):
        # Mostly a chain (the newest map), sometimes a branch from any earlier one.
        source = g.maps[-1] if draw(st.integers(0, 3)) else draw(st.sampled_from(g.maps))
        op = draw(st.sampled_from(ops))  # sampled_from does not deduplicate: repeats weigh
        appended = len(g.builder.graph.operators)
        y = op(draw, g, source)
        if y is None or int(np.prod(y.shape)) > MAX_ELEMENTS or 0 in y.shape:
            del g.builder.graph.operators[appended:]  # too large: drawn, but not part of the graph
            continue
        g.add(y)
    outputs = [g.maps[-1]]
    extra = [t for t in g.produced[:-1] if t not in outputs]
    if extra and draw(st.booleans()):
        outputs.append(draw(st.sampled_from(extra)))
    if g.maps[-1] in g.builder.graph.inputs:  # every drawn op was too large: one small op instead
        outputs = [g.builder.op("RELU" if not int8 else "MAX_POOL_2D", [g.maps[-1]], g.maps[-1].shape,
                                **({} if not int8 else dict(padding="SAME", stride_h=1, stride_w=1,
                                                            filter_height=1, filter_width=1)),
                                quant=g.maps[-1].quantization)]
    g.builder.output(*outputs)
    model = g.builder.build()
    return Drawn(with_twins(model, g.rng) if twins else model)
