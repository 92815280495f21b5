"""MediaPipe's custom CNN ops: Convolution2DTransposeBias, MaxPoolingWithArgmax2D, MaxUnpooling2D.

Segmentation models from MediaPipe carry them. Stock LiteRT has no kernel for them; XNNPACK claims
them, so LiteRT + XNNPACK is what runs such a model, and these lowerings follow XNNPACK's delegate
(tensorflow/lite/delegates/xnnpack) where it and MediaPipe's own kernels differ:

- Options are the raw bytes of TFLite's C structs (custom_options, little-endian int32 fields,
  missing trailing fields zero): TfLiteTransposeConvParams (padding, stride_w, stride_h) and
  TfLitePoolParams (padding, stride_w, stride_h, filter_w, filter_h, activation). Padding 1 is
  SAME, 2 VALID.
- Convolution2DTransposeBias: inputs (input, weights [O,kh,kw,I], bias); SAME pads the output by
  max(0, k - (in - 1) % s - 1) in total, the smaller half first; no fused activation.
- MaxPoolingWithArgmax2D: outputs (values, indices). XNNPACK pools only with filter == stride and
  no fused activation. SAME padding repeats the border (out = ceil(in / k), leading pad
  (out * k - in) / 2). The index of a maximum is its position in the window counted column-major
  (x * kh + y), the first maximum in that order winning, and is stored as the *bits* of a uint32
  in the float32 indices tensor. (MediaPipe's own kernel counts row-major and stores the index as a
  float: the two do not mix, so neither does a model split between them.)
- MaxUnpooling2D: inputs (values, indices in the same encoding), VALID padding only (XNNPACK refuses
  SAME); each input pixel's window of the output (kh x kw) is zero but at its index, which holds
  the value.
"""

from __future__ import annotations

import struct

import halide as hl

from ..values import Value
from .nn import float_arithmetic, transpose_conv
from .registry import LoweringError, OpContext, ReductionDomain, register

SAME, VALID = 1, 2


def _params(ctx: OpContext, fields: int) -> list[int]:
    """The first `fields` int32 fields of the op's C options struct (zero where the bytes end)."""
    raw = bytes(ctx.op.custom_options or b"")[: 4 * fields]
    raw += bytes(4 * fields - len(raw))
    return list(struct.unpack(f"<{fields}i", raw))


@register("CUSTOM:Convolution2DTransposeBias")
def lower_transpose_conv_bias(ctx: OpContext) -> list[Value]:
    """A transpose convolution with MediaPipe's input order and padding."""
    padding, sw, sh = _params(ctx, 3)
    if padding not in (SAME, VALID) or sw < 1 or sh < 1:
        raise LoweringError(f"Convolution2DTransposeBias: padding {padding}, strides {sw}x{sh}")
    _, kh, kw, _ = ctx.op.inputs[1].shape
    _, h, w, _ = ctx.op.inputs[0].shape
    out = ctx.out_shape()

    def total(size: int, kernel: int, stride: int) -> int:
        return max(0, kernel - (size - 1) % stride - 1) if padding == SAME else 0

    pad_h, pad_w = total(h, kh, sh), total(w, kw, sw)
    if out[1:3] != (sh * (h - 1) + kh - pad_h, sw * (w - 1) + kw - pad_w):
        raise LoweringError(f"Convolution2DTransposeBias: output {list(out)} does not follow from its input")
    return transpose_conv(ctx, 0, 1, ((sh, sw), (pad_h // 2, pad_w // 2)), float_arithmetic(ctx, 2))


def _pool_params(ctx: OpContext, paddings: tuple[int, ...]) -> tuple[int, int, int]:
    """(padding, kh, kw), refusing what XNNPACK refuses, so that claiming an op never makes a
    model run that stock LiteRT would not (nor with other semantics)."""
    padding, sw, sh, fw, fh, activation = _params(ctx, 6)
    if activation != 0:
        raise LoweringError(f"{ctx.op.name}: fused activation {activation} (XNNPACK refuses one)")
    if (fw, fh) != (sw, sh) or fw < 1 or fh < 1:
        raise LoweringError(f"{ctx.op.name}: filter {fw}x{fh} with stride {sw}x{sh} (XNNPACK pools with filter = stride)")
    if padding not in paddings:
        raise LoweringError(f"{ctx.op.name}: padding {padding}")
    return padding, fh, fw


def _index_bits(index: hl.Expr) -> hl.Expr:
    """A window index as XNNPACK stores it in a float32 tensor: the bits of a uint32."""
    return hl.reinterpret(hl.Float(32), hl.cast(hl.UInt(32), index))


@register("CUSTOM:MaxPoolingWithArgmax2D")
def lower_max_pool_argmax(ctx: OpContext) -> list[Value]:
    """Window maxima and where they are (see the module docstring for the index)."""
    padding, kh, kw = _pool_params(ctx, (SAME, VALID))
    x = ctx.value(0)
    _, h, w, _ = x.shape
    out = ctx.out_shape(0)
    top, left = ((out[1] * kh - h) // 2, (out[2] * kw - w) // 2) if padding == SAME else (0, 0)
    # r.x (window row) innermost: the order of XNNPACK's column-major index, whose first maximum wins.
    r = ReductionDomain([kh, kw], ctx.func_name("r"))

    def candidate(n, y, xx, c):
        return x(n, hl.clamp(y * kh - top + r[0], 0, h - 1), hl.clamp(xx * kw - left + r[1], 0, w - 1), c)

    best = hl.Func(ctx.func_name("argmax"))
    n, y, xx, c = (hl.Var(v) for v in ("n", "y", "x", "c"))
    best[c, xx, y, n] = hl.argmax(r, candidate(n, y, xx, c))
    ctx.materialize.append(Value(best, out, hl.Float(32)))
    values = ctx.define(ctx.func_name("values"), out, lambda *i: hl.Expr(best[list(reversed(i))][2]))
    indices = ctx.define(ctx.func_name("indices"), ctx.out_shape(1),
                         lambda *i: _index_bits(best[list(reversed(i))][1] * kh + best[list(reversed(i))][0]),
                         exact=True)
    return [values, indices]


@register("CUSTOM:MaxUnpooling2D")
def lower_max_unpool(ctx: OpContext) -> list[Value]:
    """out[n, y, x, c] = values[n, y / kh, x / kw, c] where (x % kw) * kh + y % kh is that pixel's
    index, else 0."""
    _padding, kh, kw = _pool_params(ctx, (VALID,))  # XNNPACK refuses SAME here
    values, indices = ctx.value(0), ctx.value(1)
    _, h, w, _ = values.shape
    out = ctx.out_shape()
    if out[1:3] != (h * kh, w * kw):
        raise LoweringError(f"MaxUnpooling2D: output {list(out)} is not the input scaled by {kh}x{kw}")

    def body(n, y, xx, c):
        src = (n, y / kh, xx / kw, c)
        # An index outside the window is no pixel's: XNNPACK would write outside the window with it,
        # TFLite has no kernel of its own; the invoke fails.
        at = hl.reinterpret(hl.UInt(32), indices(*src))
        at = hl.require(at < kh * kw, at, hl.Expr("MaxUnpooling2D index out of bounds: got"), at,
                        hl.Expr(f"for a {kh}x{kw} window"))
        here = hl.cast(hl.UInt(32), (xx % kw) * kh + y % kh)
        return hl.select(at == here, values(*src), hl.f32(0))

    return [ctx.define(ctx.func_name(), out, body)]
