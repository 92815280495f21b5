"""Vectorizing and threading a Func computed on its own: along TFLite's innermost axis (or the
pixels, for a few channels), transposes in square tiles, rows split among threads."""

from __future__ import annotations

import math

import halide as hl

from ..values import Value
from .params import INTERLEAVED_CHANNELS, UNROLLED_CHANNELS, CpuParams
from .tiles import parallel_worthwhile, short_axis_lanes


def loop_vars(f: hl.Func) -> list[hl.Var]:
    return [hl.Var(a.name()) for a in f.args()]


def row_axis(f: hl.Func, shape) -> hl.Var | None:
    """The outermost of `f`'s axes with more than one element, the innermost excluded: what the
    stages of a block split among threads. Every stage over the same rows takes the same axis, so
    the pool's per-thread shares give each thread the same rows in each (a LayerNorm on [1, 128,
    256] split none of its stages, which then read rows the other core's FC had written; a
    softmax's row sums ran on one thread after its exps ran on two)."""
    v = loop_vars(f)
    for k in range(len(v) - 1, 0, -1):  # Halide's order: v[0] is TFLite's innermost axis
        if shape[len(shape) - 1 - k] > 1:
            return v[k]
    return None


def fuse_outward(f: hl.Func, inner: hl.Var, outer: list[hl.Var]) -> hl.Var:
    """Fuses `inner` with each of `outer` in turn (the loops just outside it, innermost first) into one
    loop, which it returns: the tasks of a parallel loop over all of them."""
    for axis in outer:
        fused = hl.Var(inner.name() + "_" + axis.name())
        f.fuse(inner, axis, fused)
        inner = fused
    return inner


def split_rows(f: hl.Func, shape, params: CpuParams, depth: int = 1, light: bool = False) -> None:
    """Runs a stage computed at the root in parallel over its row axis (row_axis), where it has
    work enough (parallel_worthwhile)."""
    axis = row_axis(f, shape)
    if axis is not None and parallel_worthwhile(params, shape, depth, light):
        f.parallel(axis)


def lanes_of(f: hl.Func, lanes: int, extent: int, registers: int = 1) -> int:
    """Vector lanes for `f`'s element type: `lanes` float32s fill a register, so as many bytes of
    narrower types (16 int8 on NEON, not 4: a copy of 4 bytes a vector), times `registers` for
    narrow types, halved while a vector outgrows the axis. Narrower still (down to `lanes`) where
    that divides the axis and the wider one does not: a tail is a predicated vector stored a byte at
    a time (144 int8 channels in 16-byte steps, not 32); one register where nothing divides it."""
    if len(f.types()) != 1:
        return lanes  # a Tuple (ARG_MAX's value and index): as wide as its widest element
    bits = max(8, f.type().bits())
    one_register = lanes * 32 // bits
    wide = one_register * (registers if bits < 32 else 1)
    while wide > lanes and wide > extent:
        wide //= 2
    dividing = wide
    while dividing >= lanes and extent % dividing:
        dividing //= 2
    return dividing if dividing >= lanes else min(wide, one_register)


def vectorize_inner(f: hl.Func, shape, params: CpuParams, done: set[str], unrolled: bool = False,
                     joins: tuple[int, ...] = ()) -> None:
    """Vectorizes `f` along TFLite's innermost axis when that axis holds at least one vector, else
    (a few channels, as a network's RGB input) along the pixels with the channels unrolled inside:
    Halide turns the channel-strided accesses into interleaved vector loads and stores (NEON's
    ld3 / st3) instead of a scalar loop (a network's normalised RGB input). Where `unrolled` (a
    block output, a zero-padded copy, a Value.unrollable stage: a softmax's) the long axis goes up
    to `params.elementwise_vectors` vectors per step, as many as divide it, so that a loop step's
    overhead is shared (a squeeze-excite MUL); other stages keep one, as unrolled their epilogues
    (sigmoids) spill. `done`: the names of the Funcs vectorized so far, skipped (a second split of
    the same axis is an error), `f`'s added.
    `joins` (Value.joins): where a concatenation's sources meet along that axis; past
    UNROLLED_CHANNELS the loop runs in unrolled chunks that end there, so in each the select between
    the sources folds (U-Net's zero-padded 64 + 64-channel concatenation: 35 instructions a vector,
    a gather from each source, where a copy takes 3)."""
    if not shape or not f.args() or f.name() in done:
        return
    done.add(f.name())
    # Two registers of a narrow type per step: a widening copy (int8 -> int16) then loads one
    # register, extends both halves and stores two (the int16 copy before an int8 depthwise conv:
    # 6 instructions per 8 elements in a loop of one register).
    lanes = lanes_of(f, params.lanes, shape[-1], registers=2)
    v = loop_vars(f)
    most = params.elementwise_vectors if unrolled else 1
    chunk = math.gcd(shape[-1], *joins) if joins else 0
    if shape[-1] > UNROLLED_CHANNELS and chunk % lanes == 0 and chunk > 0:
        co, ci = hl.Var(v[0].name() + "_parts"), hl.Var(v[0].name() + "_part")
        f.split(v[0], co, ci, chunk, hl.TailStrategy.GuardWithIf).unroll(co)
        _vector_steps(f, ci, chunk, lanes, most)
    elif shape[-1] % lanes == 0 and shape[-1] <= UNROLLED_CHANNELS:
        co, ci = hl.Var(v[0].name() + "_vectors"), hl.Var(v[0].name() + "_lanes")
        f.split(v[0], co, ci, lanes, hl.TailStrategy.GuardWithIf).vectorize(ci).unroll(co)
    elif shape[-1] >= lanes:
        _vector_steps(f, v[0], shape[-1], lanes, most)
    elif short_lanes := short_axis_lanes(shape[-1]):
        # Fewer channels than a register holds, more than are worth interleaving: narrower vectors
        # that divide them (8 float32 channels in AVX2 halves of AVX-512's 16 lanes), not scalars.
        f.vectorize(v[0], short_lanes)
    elif len(v) >= 2 and shape[-1] <= INTERLEAVED_CHANNELS and shape[-2] >= lanes:
        # Split, not bound: a consumer whose channel tile rounds up reads past the last channel.
        co, ci = hl.Var(v[0].name() + "_o"), hl.Var(v[0].name() + "_i")
        f.split(v[0], co, ci, shape[-1], hl.TailStrategy.GuardWithIf).reorder(ci, v[1], co).unroll(ci)
        f.vectorize(v[1], lanes, hl.TailStrategy.GuardWithIf)


def _vector_steps(f: hl.Func, axis: hl.Var, extent: int, lanes: int, most: int) -> None:
    """Vectorizes `axis` (`extent` long) with up to `most` vectors per loop step, as many as divide it."""
    step = max(k for k in range(1, most + 1) if k == 1 or extent % (k * lanes) == 0)
    if step == 1:
        f.vectorize(axis, lanes, hl.TailStrategy.GuardWithIf)
    else:
        co, ci = hl.Var(axis.name() + "_steps"), hl.Var(axis.name() + "_step")
        f.split(axis, co, ci, step * lanes, hl.TailStrategy.GuardWithIf).vectorize(ci, lanes).unroll(ci)


def tile_transpose(value: Value, params: CpuParams, done: set[str]) -> bool:
    """Schedules a materialised TRANSPOSE that moves the innermost axis in square tiles of `lanes`:
    each output vector then comes from `lanes` unrolled reads along the input's own innermost axis,
    which LLVM turns into vector loads and shuffles, instead of one gather of `lanes` elements
    (an attention's K^T; a decoder's transposed key cache); where `params` stage tiles, from a tile
    of the input loaded a row a vector, transposed in registers. False
    (nothing scheduled) for any other op, a transpose that keeps the innermost axis, or one
    scheduled already (`done`, as vectorize_inner takes it: a second split of an axis is an error,
    and two reductions of a block may read one transpose)."""
    if not value.perm or value.func.name() in done:
        return False
    f, shape, rank, lanes = value.func, value.shape, value.rank, params.lanes
    source_axis = value.perm.index(rank - 1)  # the output axis that walks the input's innermost one
    if source_axis == rank - 1 or shape[-1] < lanes or shape[source_axis] < lanes:
        return False
    done.add(f.name())
    v = loop_vars(f)
    c, x = v[0], v[rank - 1 - source_axis]
    ci, xi = hl.Var(f"{c.name()}_t"), hl.Var(f"{x.name()}_t")
    # The tile loops keep the axes' names, so a later parallel() over the row axis (split_rows)
    # finds it: a decoder's [1, 1, 256, 512] key cache is split among threads by its tiles of rows.
    f.tile(c, x, c, x, ci, xi, lanes, lanes, hl.TailStrategy.GuardWithIf).vectorize(ci).unroll(xi)
    if params.stage_transpose_tiles and value.tile_source is not None:
        # The tile's input rows loaded a vector each and transposed in registers: shuffles, not
        # a lane load per element.
        s = loop_vars(value.tile_source)
        value.tile_source.compute_at(f, c).vectorize(s[0], lanes, hl.TailStrategy.GuardWithIf) \
            .unroll(s[rank - 1 - value.perm[rank - 1]])
    return True


def vectorize_helper(v: Value, params: CpuParams, vectorized: set[str], partial: bool, copy: bool = False) -> None:
    """Vectorizes a materialised helper along its innermost axis; a row reduction's partial results
    (`partial`) as one vector of them."""
    f = v.func
    if partial and f.name() not in vectorized:
        # A row reduction's partial results are one vector (4 NEON registers), so the inline
        # reduction behind them runs one loop with 4 accumulators, not 4 loops of one (LayerNorm,
        # softmax).
        f.vectorize(loop_vars(f)[0], v.shape[-1])
        vectorized.add(f.name())
    else:
        vectorize_inner(f, v.shape, params, vectorized, unrolled=copy or v.unrollable, joins=v.joins)
