"""Tensors as Halide Funcs, indexed in TFLite's axis order.

TFLite tensors are row-major with the last axis innermost; Halide lists the innermost dimension
first. A TFLite `[N, H, W, C]` tensor is therefore the Halide function `f(c, x, y, n)`. Lowerings
are written in TFLite's terms — `value(n, h, w, c)` — and this module does the reversal, so no
lowering ever thinks about Halide's dimension order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import halide as hl

from .pack import FLOAT16_MAX


# Halide dimension names, innermost first: NHWC's C is "c", W is "x", H is "y", N is "n".
DIM_NAMES = ("c", "x", "y", "n", "d4", "d5", "d6", "d7")

Index = Sequence[hl.Expr]


def narrow(expr: hl.Expr, storage: hl.Type) -> hl.Expr:
    """A float32 value as stored in `storage`. Half precision saturates at +-65504 rather than
    overflowing to infinity, so a -1e9 attention mask stays a large finite negative (softmax still
    maps it to 0) instead of turning a fully masked row into NaNs."""
    if storage == hl.Float(16):
        expr = hl.clamp(expr, hl.f32(-FLOAT16_MAX), hl.f32(FLOAT16_MAX))
    return hl.cast(storage, expr)


def read_type(stored: hl.Type) -> hl.Type:
    """The type lowerings compute with for a stored type: half precision reads as float32."""
    return hl.Float(32) if stored == hl.Float(16) else stored


def widen(expr: hl.Expr) -> hl.Expr:
    """A stored element as lowerings compute with it (see read_type)."""
    wide = read_type(expr.type())
    return expr if wide == expr.type() else hl.cast(wide, expr)


def dim_vars(rank: int) -> list[hl.Var]:
    """Vars for a tensor of `rank`, in TFLite axis order (the last one is "c")."""
    return [hl.Var(DIM_NAMES[rank - 1 - axis]) for axis in range(rank)]


@dataclass
class Value:
    """A tensor during lowering: a Func, its TFLite shape and its element type."""

    func: hl.Func
    shape: tuple[int, ...]
    type: hl.Type
    # How many channels (the innermost axis) the Func may be read at without any read out of
    # bounds: a float convolution over weights and bias packed to a padded channel count computes
    # the channels past its last as zeros. 0: just shape[-1]. A consumer whose tiles round up past
    # the last channel (a depthwise tile of 16 over 72) then reads those instead of clamping.
    readable_channels: int = 0
    # Channels (innermost-axis indices) where the Func's definition passes from one source to the
    # next: a CONCATENATION along its channels. A schedule that splits the channel loop there
    # copies each part densely instead of selecting between gathers of both (schedule.vectors).
    joins: tuple[int, ...] = ()
    # A TRANSPOSE's result: output axis k reads input axis perm[k] (a schedule tiles transposes that
    # move the innermost axis). () for anything else.
    perm: tuple[int, ...] = ()
    # Of a TRANSPOSE's result: the input as a Func of its own (inlined unless scheduled), which a
    # schedule stages a tile of, loaded along the input's own innermost axis (tile_transpose).
    tile_source: hl.Func | None = None
    # The most |element| can be, where the op that made it says (a sigmoid's 1); None: unknown. A
    # product with such a factor of at most 1 cannot overflow, so it needs no saturating clamp.
    magnitude: float | None = None
    # Few values live per element (no division, no select between branches: a softmax's
    # exponentials and its scaling by 1 / sum): a schedule may unroll several vectors a loop step
    # without spilling, where a sigmoid's constants and temporaries would.
    unrollable: bool = False

    @property
    def read_type(self) -> hl.Type:
        """The type of an element as read (see the module's read_type)."""
        return read_type(self.type)

    @property
    def rank(self) -> int:
        """Number of TFLite axes."""
        return len(self.shape)

    def __call__(self, *index: hl.Expr) -> hl.Expr:
        """The element at a TFLite-order index."""
        if len(index) != self.rank:
            raise ValueError(f"{self.func.name()}: {len(index)} indices for a rank-{self.rank} tensor")
        return widen(self.stored_at(index))

    def at(self, index: Index) -> hl.Expr:
        """The element at a TFLite-order index given as a sequence."""
        return self(*index)

    def stored_at(self, index: Index) -> hl.Expr:
        """The element at a TFLite-order index in its stored type (half precision not widened), for
        ops that compute in it (LoweringOptions.half_arithmetic)."""
        return hl.Expr(self.func[list(reversed(index))] if len(index) else self.func[()])


def define(name: str, shape: Sequence[int], body: Callable[..., hl.Expr], *, storage: hl.Type) -> Value:
    """A new Func of `shape` whose element at TFLite index (i0, ..., ik) is body(i0, ..., ik).

    A float result is stored as `storage` (a lowering's OpContext.define gives its target's: fp16
    on a GPU target in half precision, rounded here and widened back to float32 where read, so the
    arithmetic inside an op stays float32).
    """
    shape = tuple(int(d) for d in shape)
    f = hl.Func(name)
    idx = dim_vars(len(shape))
    expr = body(*idx)
    if not isinstance(expr, hl.Expr):  # a FuncRef or a Python number
        expr = hl.Expr(expr)
    if expr.type().is_float() and expr.type() != storage:
        expr = narrow(expr, storage)
    if idx:
        f[list(reversed(idx))] = expr
    else:
        f[()] = expr
    return Value(f, shape, f.type())


def broadcast_index(shape: Sequence[int], out_shape: Sequence[int], index: Index) -> list[hl.Expr]:
    """NumPy / TFLite broadcasting: the index into `shape` for an output index of `out_shape`.

    Shapes align on the right; a size-1 axis is read at 0.
    """
    offset = len(out_shape) - len(shape)
    if offset < 0:
        raise ValueError(f"cannot broadcast {list(shape)} to {list(out_shape)}")
    return [hl.Expr(0) if d == 1 and out_shape[offset + a] != 1 else index[offset + a] for a, d in enumerate(shape)]


def read_broadcast(value: Value, out_shape: Sequence[int], index: Index, *, stored: bool = False) -> hl.Expr:
    """`value` read at an output index, broadcasting as TFLite does; in its stored type where `stored`
    (Value.stored_at), else as lowerings compute with it."""
    at = broadcast_index(value.shape, out_shape, index)
    return value.stored_at(at) if stored else value.at(at)


def flat_index(shape: Sequence[int], index: Index) -> hl.Expr:
    """The row-major linear offset of a TFLite-order index."""
    flat: hl.Expr = hl.Expr(0)
    for d, i in zip(shape, index):
        flat = flat * int(d) + i
    return flat


def unflatten(shape: Sequence[int], flat: hl.Expr) -> list[hl.Expr]:
    """The TFLite-order index of a row-major linear offset (div/mod arithmetic)."""
    index: list[hl.Expr] = []
    for d in reversed(shape):
        index.append(flat % int(d))
        flat = flat / int(d)
    return list(reversed(index))


# BOOL tensors are stored as one byte per element (as TFLite does): uint8 0 / 1 in buffers.
_HALIDE_TYPES = {
    "FLOAT32": hl.Float(32), "FLOAT16": hl.Float(16), "INT8": hl.Int(8), "UINT8": hl.UInt(8),
    "INT16": hl.Int(16), "INT32": hl.Int(32), "INT64": hl.Int(64), "BOOL": hl.UInt(8),
}


def halide_type(type_name: str) -> hl.Type:
    """The Halide storage type for a TFLite type name (BOOL is uint8)."""
    try:
        return _HALIDE_TYPES[type_name]
    except KeyError:
        raise NotImplementedError(f"no Halide type for TFLite {type_name}") from None


def tflite_type_name(t: hl.Type) -> str:
    """The TFLite type name a Halide storage type stands for (uint8 is UINT8, never BOOL)."""
    for name, halide in _HALIDE_TYPES.items():
        if halide == t and name != "BOOL":
            return name
    raise NotImplementedError(f"no TFLite type for Halide {t}")


