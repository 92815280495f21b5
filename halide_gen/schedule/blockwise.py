"""The CPU template of a matrix product whose weights are scaled per block of its depth
(AccumulatorKind.BLOCKWISE: FULLY_CONNECTED with weights quantized per block).

A register tile of output channels (vectorized) x rows (unrolled), as a matrix product's: the float
accumulator is computed at the tile, its loop over the blocks outside the tile; at each block the
block's int32 sums are computed for the same tile, in the int8 path's dot-product loops (4 steps of
the block a lane), then converted, scaled and added. Each tile thus holds two accumulators, so it
takes half a matrix product's rows. Channel tiles are the parallel tasks, each passing every row of
its slice of the weights while they are in cache.
"""

from __future__ import annotations

import halide as hl

from ..block import Accumulator
from ..pack import CHANNEL_TILE, padded
from .params import CpuParams
from .tiles import parallel_worthwhile
from .vectors import fuse_outward, loop_vars


# Int32 vectors of a single row's tile: independent dot-product chains enough to cover the latency.
SINGLE_ROW_VECTORS = 8


def schedule_blockwise(home: hl.Func, acc: Accumulator, params: CpuParams, channels: int) -> None:
    """Tiles `home` (where the product's output is computed) into `channels` x rows tiles, with the
    float accumulator and the per-block sums (acc.inner) computed at each, the sums at each block."""
    lanes, guard = params.lanes, hl.TailStrategy.GuardWithIf
    shape = acc.value.shape
    rows = min(shape[-2], max(1, params.mm_rows // 2)) if len(shape) > 1 else 1
    if rows == 1:
        # One row (a decoder's token): more channels a tile, so that the dot products' chains (one
        # per int32 vector, each waiting on its last) overlap; whole tiles of the packed weights.
        tiles = padded(shape[-1]) // CHANNEL_TILE
        most = SINGLE_ROW_VECTORS * lanes // CHANNEL_TILE
        channels = max(channels, CHANNEL_TILE * max(k for k in range(1, min(tiles, most) + 1) if tiles % k == 0))
    v = loop_vars(home)
    c = v[0]
    co, ci = hl.Var(c.name() + "_o"), hl.Var(c.name() + "_i")
    home.split(c, co, ci, channels, guard).vectorize(ci, lanes).unroll(ci)
    inner_tile = co
    if len(v) > 1:
        x = v[1]
        xo, xi = hl.Var(x.name() + "_o"), hl.Var(x.name() + "_i")
        home.split(x, xo, xi, rows, guard).reorder([hl.VarOrRVar(w) for w in (ci, xi, xo, co, *v[2:])]).unroll(xi)
        inner_tile = xo
    if parallel_worthwhile(params, shape, int(acc.extents[0]) * int(acc.inner_rdom.extents[0])):
        home.parallel(fuse_outward(home, co, v[2:]) if len(v) > 2 else co)

    f, inner = acc.acc, acc.inner
    av = loop_vars(f)
    f.compute_at(home, inner_tile)
    tile = [hl.VarOrRVar(av[0])] + [hl.VarOrRVar(a) for a in av[1:2]]
    f.bound_storage(av[0], channels).vectorize(av[0], lanes, hl.TailStrategy.RoundUp).unroll(av[0])
    update = f.update()
    block = acc.rdom[0]
    update.reorder(tile + [hl.VarOrRVar(block)] + [hl.VarOrRVar(a) for a in av[2:]])
    update.vectorize(av[0], lanes, hl.TailStrategy.RoundUp).unroll(av[0])
    if len(av) > 1:
        f.bound_storage(av[1], rows).unroll(av[1])
        update.unroll(av[1])

    # The block's sums for the tile, at each block: channels x rows int32 vectors, each step a dot
    # product of 4 int8 pairs a lane (vpdpbusd, sdot).
    iv = loop_vars(inner)
    inner.compute_at(f, block).bound_storage(iv[0], channels).vectorize(iv[0], lanes, hl.TailStrategy.RoundUp)
    inner.unroll(iv[0])
    step = acc.inner_rdom[0]
    outer_steps, dot_step = hl.RVar(step.name() + "_o"), hl.RVar(step.name() + "_i")
    sums = inner.update().split(step, outer_steps, dot_step, acc.dot)
    sums.reorder([hl.VarOrRVar(dot_step), hl.VarOrRVar(iv[0])] + [hl.VarOrRVar(a) for a in iv[1:2]]
                 + [hl.VarOrRVar(outer_steps)] + [hl.VarOrRVar(a) for a in iv[2:]])
    sums.atomic().vectorize(dot_step)
    sums.vectorize(iv[0], lanes, hl.TailStrategy.RoundUp).unroll(iv[0])
    if len(shape) > 1:
        inner.bound_storage(iv[1], rows).unroll(iv[1])
        sums.unroll(iv[1])
