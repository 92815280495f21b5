"""Register tiles: a convolution or matrix product computed a tile of output channels x pixels
(or rows) at a time, its accumulators in registers and its reduction loops outside the tile; the
tile's shape comes from the tile model (tiles.py)."""

from __future__ import annotations

import halide as hl
import numpy as np

from fusion.mapping import ELEMENTWISE, MtM, op_mapping

from ..block import Accumulator, BlockKernel
from ..lower import AccumulatorKind
from ..values import Value
from .params import INTERLEAVED_CHANNELS, MATMUL_TASK_WORK, MATMUL_TASKS, ROW_TASKS, CpuParams
from .tiles import (depthwise_tile, group_wrapper, parallel_worthwhile, reduction_steps, tile_shape,
                    weights_outgrow_cache, whole_map_channels, whole_map_rows)
from .vectors import fuse_outward, lanes_of, loop_vars, tile_transpose, vectorize_inner


def home_of(kernel: BlockKernel, acc: Accumulator) -> hl.Func:
    """The Func where the accumulator's op output is realized: the block output that copies it, or
    that computes it through an elementwise epilogue (the op's result inlined), or else the op's own
    Func, computed at the root, when later ops of the block read it otherwise."""
    if kernel.inline_into_output(acc.value.func):
        for _, v in kernel.outputs:
            if kernel.copied_from.get(id(v.func)) is acc.value.func:
                return v.func
    if _feeds_only_its_epilogue(kernel, acc):
        return kernel.outputs[0][1].func
    acc.value.func.compute_root()
    return acc.value.func


def _feeds_only_its_epilogue(kernel: BlockKernel, acc: Accumulator) -> bool:
    """Whether the block's last reduction feeds nothing but an elementwise epilogue (bias, an
    activation, HARD_SWISH, a squeeze-excite MUL, a residual ADD) into the block's one output, all
    at the reduction's own indices: the epilogue then runs in the reduction's register tile instead
    of a pass of its own over a materialised result (MobileNetV3's first conv + HARD_SWISH, a
    U-Net's final conv + LOGISTIC)."""
    if acc is not kernel.accumulators[-1] or len(kernel.outputs) != 1 or len(acc.value.shape) < 2:
        return False
    shape = tuple(acc.value.shape)
    after = kernel.ops[acc.op_index + 1:]
    return (tuple(kernel.outputs[0][0].shape) == shape
            and all(op.name in ELEMENTWISE and tuple(op.outputs[0].shape) == shape for op in after))


# Ops computed from an exponential (halide_gen.lower.ieee's exp_nonpositive, expm1_nonpositive, exp_between).
EXPONENTIAL = frozenset({"EXP", "LOGISTIC", "TANH", "ELU"})


def exponential_epilogue(kernel: BlockKernel, acc: Accumulator) -> bool:
    """Whether the reduction's register tile computes an epilogue built on an exponential (EXP,
    LOGISTIC, TANH, ELU, the tanh-form GELU). Unrolled over the tile's rows as well as its vectors,
    its constants no longer fit in registers beside the accumulators (on NEON each polynomial step
    also copies its constant), so only a row's vectors are unrolled; erf's GELU gains nothing from
    that (bench/RESULTS.md, "What an activation after a matrix product costs")."""
    return _feeds_only_its_epilogue(kernel, acc) and any(
        op.name in EXPONENTIAL or (op.name == "GELU" and bool(getattr(op.options, "approximate", False)))
        for op in kernel.ops[acc.op_index + 1:])


def _align_to_packing(home: hl.Func, acc: Accumulator, c: hl.Var, channels: int, round_up: bool) -> None:
    """Aligns the channels an op's own Func is computed over to its tile, when tiles round up.

    A result computed at the root (not inside a block output) is realized over what its consumers
    read, which may start mid-tile (a STRIDED_SLICE from channel 1 of a depthwise conv): tiles
    rounded up from there ran past the packed bias (channels padded to pack.CHANNEL_TILE, which
    every tile size divides). Aligned, every tile lies inside the packing. Block outputs are
    realized from 0 already (and their bounds are the caller's).
    """
    if round_up and home is acc.value.func:
        home.align_bounds(c, channels)


def register_tile(home: hl.Func, acc: Accumulator, params: CpuParams, channels: int, pixels: int,
                   rdom_order: list[int] | None, unroll_taps: bool, round_up_channels: bool,
                   parallel: bool = True, whole_map: bool = False,
                   rows_outer: bool = False, unroll_rows: bool = True,
                   per_tile: list[Value] = (), shift_last_rows: bool = False,
                   shift_last_channels: bool = False) -> tuple[hl.Var, int] | None:
    """Tiles `home` into channels x pixels register tiles and computes the accumulator at each,
    its reduction loops (in `rdom_order`, innermost first) outside the tile. `whole_map`: the
    template owns the loops (not a conv chain's strips), so a tiny map's rows may be one tile
    (whole_map_rows) and the channel tiles may go outside the rows (weights_outgrow_cache).
    `rows_outer` (a matrix product): the channel tiles go inside the row tiles instead, and the
    row-tile loop and the rows of a tile are returned, for stages computed once per row tile
    (schedule_attention). `unroll_rows=False` leaves the tile's rows (pixels) a loop, its vectors
    of channels unrolled (exponential_epilogue). `per_tile` (materialize_prologue's): computed per
    tile of pixels where the channel tiles run inside it, which then all read it from L1 (SegFormer's
    head concatenates four 256-channel maps of 128 x 128 for a 1x1 conv: 64 MB stored and read back
    at the root); else shared among threads at the root. `shift_last_rows`: where the tile's rows
    do not divide the rows, the last tile shifts back over rows its neighbour computes (computed
    twice), for stages computed per row tile, whose loops then run a constant length.
    `shift_last_channels`: likewise the last channel tile, where `home` is a product with no
    epilogue (nothing elementwise is computed twice): a guarded tail tile ran its vectors through
    predicated loads and a stack copy of each step's inputs."""
    lanes = params.lanes
    v = loop_vars(home)
    c = v[0]
    co, ci = hl.Var(c.name() + "_o"), hl.Var(c.name() + "_i")
    guard = hl.TailStrategy.GuardWithIf
    parallel = parallel and parallel_worthwhile(params, acc.value.shape, int(np.prod(acc.extents)))
    row_loop = None
    if len(v) == 1:
        # A rank-1 result (a matrix-vector product): its tiles of output channels are the only
        # work to share.
        _align_to_packing(home, acc, c, channels, round_up_channels)
        home.split(c, co, ci, channels, guard).vectorize(ci, lanes)
        if parallel:
            home.parallel(co)
        acc.acc.compute_at(home, co).vectorize(loop_vars(acc.acc)[0], lanes, hl.TailStrategy.RoundUp)
        return
    x = v[1]
    rvars = [acc.rdom[k] for k in range(acc.rdom.dimensions())]
    order = rvars if rdom_order is None else [rvars[k] for k in rdom_order]
    innermost = 0 if rdom_order is None else rdom_order[0]
    steps, groups = reduction_steps(acc, params, innermost, unroll_taps)
    if acc.dot and params.dot_tile[0]:
        channels, pixels = params.dot_tile
    # A dot-product group is one instruction per accumulator vector: one step of the tile model,
    # whose input loads then serve `groups` steps (as a float vector load serves 4 fmla by element).
    channels, pixels = tile_shape(acc, params, channels, pixels, round_up_channels, groups if acc.dot else steps,
                                   modelled=not unroll_taps)
    rows = whole_map_rows(acc, params, len(v)) if whole_map else 0
    if rows:
        channels, pixels = whole_map_channels(acc, params, channels, round_up_channels, rows), acc.value.shape[-2]
    few = _few_channels(acc, home, len(v))
    if few:
        channels, pixels = few, min(lanes, acc.value.shape[-2])  # a vector of pixels, or the whole row
    _align_to_packing(home, acc, c, channels, round_up_channels)
    xo, xi = hl.Var(x.name() + "_o"), hl.Var(x.name() + "_i")
    shift = hl.TailStrategy.ShiftInwards
    # The last row tile shifted back over rows its neighbour computes: every tile is `pixels` rows,
    # so what the row-tile loop computes (an attention core's scores and softmax) runs loops of a
    # constant length (grouped-query attention's 394 or 788 query rows).
    last_rows = shift if shift_last_rows and _shifts(acc.value.shape[-2], pixels) else guard
    # The last channel tile likewise (TinyBERT's weights x values over heads of 26: 16 + 10).
    last_channels = shift if shift_last_channels and _shifts(acc.value.shape[-1], channels) else guard
    home.split(c, co, ci, channels, last_channels).split(x, xo, xi, pixels, last_rows).reorder(ci, xi, co, xo)
    if few:
        # Vectors of pixels, the few channels unrolled: the tile's epilogue (a sigmoid) runs on
        # whole vectors, not on 2 of 16 lanes.
        home.reorder(xi, ci).vectorize(xi).unroll(ci)
    else:
        # unroll(ci) unrolls the vectors left after vectorize. An int8 output takes a tile's worth of
        # channels at once, so its int32 epilogue narrows whole registers (4 int32 vectors -> 16 bytes).
        home.vectorize(ci, lanes_of(home, lanes, channels)).unroll(ci)
        if unroll_rows:
            home.unroll(xi)
    few_rows = len(v) > 2 and acc.kind == AccumulatorKind.CONV and acc.value.shape[-3] < ROW_TASKS
    if rows:
        # A band of rows (the whole map, where it fits) in one tile: each weight is read once per
        # band, not once per row, and the bands of a channel tile follow one another while its
        # slice of the weights is in cache.
        y = v[2]
        if rows < acc.value.shape[-3]:
            y, yi = hl.Var(v[2].name() + "_o"), hl.Var(v[2].name() + "_i")
            home.split(v[2], y, yi, rows, hl.TailStrategy.RoundUp)
            home.reorder([hl.VarOrRVar(w) for w in (ci, xi, yi, xo, y, co, *v[3:])]).unroll(yi)
        else:
            home.reorder([hl.VarOrRVar(w) for w in (ci, xi, y, xo, co, *v[3:])]).unroll(y)
        inner_tile = xo
        if parallel:
            home.parallel(co)
    elif whole_map and len(v) > 2 and weights_outgrow_cache(acc, params):
        # Each channel tile's slice of the weights stays in cache while every row passes; with the
        # rows outside, all the weights would come from beyond the cache once per row.
        home.reorder([hl.VarOrRVar(w) for w in (ci, xi, xo, v[2], co, *v[3:])])
        inner_tile = xo
        if parallel:
            home.parallel(co)
    elif rows_outer:
        # Channel tiles inside the row tiles, so that what the row-tile loop computes (an attention
        # core's scores and softmax) serves every channel tile of its rows; the tasks are row tiles
        # times the outer axis (heads).
        home.reorder([hl.VarOrRVar(w) for w in (ci, xi, co, xo, *v[2:])])
        inner_tile = co
        row_loop = xo
        if len(v) > 2:
            fused = hl.Var(xo.name() + "_h")
            home.fuse(row_loop, v[2], fused)
            row_loop = fused
        if parallel:
            home.parallel(row_loop)
    elif acc.kind == AccumulatorKind.MATMUL or few_rows:
        # Output-channel tiles outside the row (or pixel) tiles: for a matrix product, a slice of
        # the weights stays in cache while every row passes; the tasks are channel tiles times the
        # next axis (a batch matmul's heads, a small map's rows), never one parallel loop per head.
        home.reorder([hl.VarOrRVar(w) for w in (ci, xi, xo, co, *v[2:])])
        inner_tile = xo
        tiles = -(-acc.value.shape[-1] // channels)
        outer = acc.value.shape[-3] if len(v) > 2 else 1
        row_groups = _row_groups(acc, pixels, tiles * outer) if acc.kind == AccumulatorKind.MATMUL else 1
        if parallel and row_groups > 1:
            inner_tile = _parallel_with_row_groups(home, xo, co, v[2:], -(-acc.value.shape[-2] // pixels), row_groups)
        elif parallel and len(v) > 2:
            _parallel_with_channel_groups(home, co, v[2], -(-acc.value.shape[-1] // channels), acc.value.shape[-3])
        elif parallel:
            home.parallel(co)
    else:
        inner_tile = co
        if parallel:
            home.parallel(v[2] if len(v) > 2 else xo)
        for p in per_tile:
            # A constant size (a row's last tile may be shorter): on the stack, not a heap allocation per tile.
            p.func.compute_at(home, xo).bound_storage(loop_vars(p.func)[1], pixels)
        per_tile = ()
    for p in per_tile:
        parallel_rows(p, params)

    f = acc.acc
    av = loop_vars(f)
    f.compute_at(home, inner_tile)  # the innermost of the two tile loops
    # A fixed-size tile gives the accumulator constant strides, so LLVM keeps it in registers
    # (a tail tile's smaller realized extent would make the stride a runtime value).
    f.bound_storage(av[0], channels).bound_storage(av[1], pixels)
    channel_tail = hl.TailStrategy.RoundUp if round_up_channels else guard
    # Narrow terms: the whole tile's channels in one vector, so each tap loads a register of int8
    # inputs (16 bytes on NEON) instead of 4 bytes per int32 vector.
    acc_lanes = channels if acc.narrow or few else lanes
    f.vectorize(av[0], acc_lanes, channel_tail).unroll(av[0]).unroll(av[1])
    update = f.update()
    tile_loops = [hl.VarOrRVar(av[0]), hl.VarOrRVar(av[1])]
    chains = interleaved_chains(acc, params, innermost, -(-channels // acc_lanes) * pixels)
    if chains > 1 and steps == 1 and not (rows or unroll_taps):
        # Too few accumulators to cover the FMA latency (a squeeze-excite conv on one pixel, a
        # matrix-vector product): `chains` interleaved partial sums per accumulator, added at the end.
        outer, chain_step = hl.RVar(order[0].name() + "_k"), hl.RVar(order[0].name() + "_chain")
        update.split(order[0], outer, chain_step, chains)
        chain = hl.Var(f.name() + "_chain")
        partials = update.rfactor([(chain_step, chain)])
        total = f.update().vectorize(av[0], acc_lanes, channel_tail).unroll(av[0]).unroll(av[1])
        total.unroll(hl.RVar(chain_step.name()))  # the partials' sum, over the chains
        partials.compute_at(home, inner_tile).bound_storage(av[0], channels).bound_storage(av[1], pixels)
        partials.vectorize(av[0], acc_lanes, channel_tail).unroll(av[0]).unroll(av[1]).unroll(chain)
        update = partials.update()
        update.unroll(chain)
        tile_loops.append(hl.VarOrRVar(chain))
        order = [outer, *order[1:]]
    if rows:
        f.bound_storage(av[2], rows).unroll(av[2])
        tile_loops.append(hl.VarOrRVar(av[2]))
        update.unroll(av[2])
    if steps > 1:
        # The innermost reduction axis in groups of `steps`, unrolled inside the tile: each pixel's
        # `steps` consecutive input values come in one vector load (the source read through a
        # wrapper computed per group), and each lane multiplies a vector of weights.
        outer, inner = hl.RVar(order[0].name() + "_o"), hl.RVar(order[0].name() + "_i")
        if groups > 1:  # dot-product groups by lane: `groups` of them per input load
            rest, group_index = hl.RVar(order[0].name() + "_r"), hl.RVar(order[0].name() + "_g")
            update.split(order[0], outer, rest, steps * groups).split(rest, group_index, inner, steps)
            tile_loops.append(hl.VarOrRVar(group_index))
        else:
            update.split(order[0], outer, inner, steps)
        order = [outer, *order[1:]]
        # A dot-product group is the innermost loop, vectorized with the channels into one
        # VectorReduce (lanes x 4 int8 products summed into lanes int32: `sdot` on ARMv8.2).
        tile_loops.insert(0 if acc.dot else len(tile_loops), hl.VarOrRVar(inner))
    update.reorder(tile_loops + [hl.VarOrRVar(r) for r in order] + [hl.VarOrRVar(a) for a in av[2 + bool(rows):]])
    if acc.dot:
        update.atomic().vectorize(inner)
    update.vectorize(av[0], acc_lanes, channel_tail).unroll(av[0]).unroll(av[1])
    if steps > 1:
        # Unrolled inside the tile: every float step, or the dot-product groups a load serves.
        if not acc.dot:
            update.unroll(inner)
        elif groups > 1:
            update.unroll(group_index)
        load_at = _unroll_float_groups(update, acc, params, outer, innermost, steps)
        if group_wrapper(acc, steps, groups):
            group = acc.source.in_(f)
            group.compute_at(f, load_at).vectorize(loop_vars(group)[0], steps * groups)
            for var in loop_vars(group)[1:]:
                group.unroll(var)
    if unroll_taps:
        for r in order:
            update.unroll(r)
    return (row_loop, pixels) if row_loop is not None else None


def _shifts(extent: int, tile: int) -> bool:
    """Whether a last tile shifted back over its neighbour replaces a shorter one."""
    return extent > tile and extent % tile != 0


# Fewest steps of the reduction each interleaved partial sum takes (below that, adding the
# partials costs about what they save).
MIN_CHAIN_STEPS = 8


def interleaved_chains(acc: Accumulator, params: CpuParams, innermost: int, accumulators: int) -> int:
    """How many interleaved partial sums each of a float register tile's `accumulators` vectors
    keeps (1: none): enough for params.min_chains independent chains in all, each at least
    MIN_CHAIN_STEPS steps of the innermost reduction axis, whose extent they divide."""
    if acc.dot or acc.narrow or not acc.acc.type().is_float() or accumulators >= params.min_chains:
        return 1
    extent = acc.extents[innermost]
    chains = 1 << ((params.min_chains // accumulators).bit_length() - 1)  # a power of two, at most the need
    while chains > 1 and (extent % chains or extent // chains < MIN_CHAIN_STEPS):
        chains //= 2
    return chains


def _unroll_float_groups(update: hl.Stage, acc: Accumulator, params: CpuParams, outer: hl.RVar,
                         innermost: int, steps: int) -> hl.RVar:
    """Unrolls `params.reduce_groups_unrolled` iterations of a float tile's loop over groups of
    `steps` reduction steps (`outer`) where they divide it and it is the only reduction axis with more
    than one step (a matrix product, a pointwise conv); returns the loop each group's input loads
    belong in (the unrolled one, or `outer` unchanged). Not inside a 3x3 conv's taps: LLVM then
    loads both groups' inputs at once and spills the tile."""
    unrolled = params.reduce_groups_unrolled
    groups = acc.extents[innermost] // steps
    taps = any(e > 1 for k, e in enumerate(acc.extents) if k != innermost)
    if acc.dot or unrolled < 2 or groups % unrolled or taps:
        return outer
    pairs, within = hl.RVar(outer.name() + "_p"), hl.RVar(outer.name() + "_u")
    update.split(outer, pairs, within, unrolled).unroll(within)
    return within


def _parallel_with_channel_groups(home: hl.Func, co: hl.Var, outer: hl.Var, tiles: int, extent: int) -> None:
    """Runs `home` in parallel over `outer` (`extent` rows, or a batch) times groups of its `tiles`
    channel tiles, about ROW_TASKS tasks in all. Whole groups, not single tiles: Halide's pool takes
    each task under one lock, and 126 single tiles of a 7x7 map made two threads slower than one."""
    groups = min(tiles, -(-ROW_TASKS // extent))
    if groups > 1:
        cg, cgi = hl.Var(co.name() + "_g"), hl.Var(co.name() + "_gi")
        home.split(co, cg, cgi, -(-tiles // groups), hl.TailStrategy.GuardWithIf)  # cg lands next to `outer`
        task = hl.Var(co.name() + "_task")
        home.fuse(cg, outer, task).parallel(task)
    else:
        home.parallel(outer)


def _row_groups(acc: Accumulator, pixels: int, tasks: int) -> int:
    """Groups of row tiles (of `pixels` rows) a matrix product's threads need beside its `tasks`
    (channel tiles times batches): as many as make MATMUL_TASKS tasks in all, each group two row
    tiles at least and each task MATMUL_TASK_WORK of the product's multiply-adds at least: a smaller
    task costs its hand-over for little. A projection to 32 channels over 16384 tokens is one channel tile: one
    task, one thread; TinyBERT's 312 output channels over 128 tokens are 10 tasks, and two threads
    taking 5 each waited on the last whole one (1.1x XNNPACK's time at two threads)."""
    row_tiles = -(-acc.value.shape[-2] // pixels)
    work = int(np.prod(acc.value.shape)) * int(np.prod(acc.extents))
    return max(1, min(-(-MATMUL_TASKS // tasks), row_tiles // 2, work // (tasks * MATMUL_TASK_WORK)))


def _parallel_with_row_groups(home: hl.Func, xo: hl.Var, co: hl.Var, outer: list[hl.Var], row_tiles: int,
                              groups: int) -> hl.Var:
    """Runs `home` in parallel over `groups` groups of its `row_tiles` row tiles times its channel
    tiles (and `outer`, a batch), each group's rows passing every channel tile in turn; returns the
    loop of row tiles within a group (where the accumulator is computed)."""
    xg, xi = hl.Var(xo.name() + "_g"), hl.Var(xo.name() + "_gi")
    home.split(xo, xg, xi, -(-row_tiles // groups), hl.TailStrategy.GuardWithIf)
    home.reorder(co, xg)  # (xi, co, xg, outer...): tasks ordered by rows, as the row-split stages after it
    home.parallel(fuse_outward(home, co, [xg, *outer]))
    return xi


def _few_channels(acc: Accumulator, home: hl.Func, rank: int) -> int:
    """The channel count of a float convolution whose output has so few (<= INTERLEAVED_CHANNELS,
    rounded up to a power of two) that its register tile runs over vectors of pixels instead, when
    an elementwise epilogue is computed in the tile (its home is not the op's own result) and a row
    holds more pixels than that (a squeeze-excite conv's one pixel is one vector of its channels,
    not a scalar epilogue per channel); else 0."""
    channels = acc.value.shape[-1]
    if acc.kind != AccumulatorKind.CONV or acc.dot or acc.narrow or rank < 3 or channels > INTERLEAVED_CHANNELS:
        return 0
    rounded = 1 << (channels - 1).bit_length()
    if acc.value.shape[-2] <= rounded or home is acc.value.func:
        return 0
    return rounded


def materialize_prologue(kernel: BlockKernel, acc: Accumulator, params: CpuParams, vectorized: set[str]) -> list[Value]:
    """Computes the in-block producers of a reduction's inputs once, at the root (`vectorized`:
    as vectorize_inner takes it). Returns those a pointwise convolution may compute per pixel tile
    instead (register_tile's `per_tile`), not yet shared among threads.

    Inlined, an elementwise producer (GELU before a fully-connected layer) would be recomputed for
    every output channel, and a TRANSPOSE before a matrix product would turn its dense loads into
    strided ones.
    """
    op = kernel.ops[acc.op_index]
    if kernel.op_helpers[acc.op_index] and not quantizes_as_it_runs(kernel, acc):
        return []  # the op reads its input once, through a helper it materialises (a zero-padded copy)
    transposed_block_input(kernel, acc, params)
    per_tile = []
    for t in op.inputs:
        v = kernel.values.get(id(t)) if t is not None else None
        if v is None or id(v.func) not in kernel.read_in_block or any(v.func is a.value.func for a in kernel.accumulators):
            continue
        producer = next((o for o in kernel.ops[: acc.op_index] if any(u is t for u in o.outputs)), None)
        if producer is None or op_mapping(producer) == MtM:
            continue
        v.func.compute_root()
        if not tile_transpose(v, params, vectorized):
            vectorize_inner(v.func, v.shape, params, vectorized, unrolled=True, joins=v.joins)
        if producer.name == "CONCATENATION" and _pointwise(acc, t):
            per_tile.append(v)
        else:
            parallel_rows(v, params)
    return per_tile


def quantizes_as_it_runs(kernel: BlockKernel, acc: Accumulator) -> bool:
    """Whether the op's helpers hold row statistics (a dynamic-range op's): its input is read whole
    for them before any of it is quantized, and beside its quantized copy, so an in-block producer
    inlined into them ran once for each (a swish before a depthwise conv: its sigmoid three times)."""
    statistics = {id(v.func) for s in kernel.row_statistics for v in (*s.results, *s.inner, *s.roots)}
    return any(id(h.func) in statistics for h in kernel.op_helpers[acc.op_index])


def parallel_rows(v: Value, params: CpuParams) -> None:
    """Splits a materialised producer's outer rows among threads, where it has work enough."""
    fv = loop_vars(v.func)
    if len(fv) > 1 and parallel_worthwhile(params, v.shape):
        v.func.parallel(fv[-1] if v.shape[0] > 1 or len(fv) < 3 else fv[-2])


def _pointwise(acc: Accumulator, source) -> bool:
    """Whether a float convolution reads `source` one pixel per output pixel (1x1, stride 1): a tile of
    its output pixels then needs exactly those pixels of the source, every input channel."""
    return (acc.kind == AccumulatorKind.CONV and not acc.dot and not acc.narrow and all(e == 1 for e in acc.extents[:-1])
            and tuple(source.shape[:-1]) == tuple(acc.value.shape[:-1]))


def transposed_block_input(kernel: BlockKernel, acc: Accumulator, params: CpuParams) -> None:
    """Stores a BATCH_MATMUL's right operand transposed, once at the root, where the product reads
    it transposed (adj_y: an attention's keys, K read as K^T) straight from the block's input: the
    output channels, its vector lanes, would otherwise be gathered at a stride of the depth (64
    floats for a head of 64), one gather per vector of every step. Written in square tiles (each
    vector stored from `lanes` reads along the input's rows, LLVM's shuffles) across the heads'
    threads."""
    op = kernel.ops[acc.op_index]
    if op.name != "BATCH_MATMUL" or not getattr(op.options, "adjY", False) or acc.dot or acc.narrow:
        return
    rhs = op.inputs[1]
    if rhs.is_constant or not any(a.tensor is rhs and not a.pack for a in kernel.arguments):
        return  # a weight (packed for its kernel), or computed in the block (materialize_prologue)
    v = kernel.values[id(rhs)]
    lanes = params.lanes
    if v.rank < 2 or v.shape[-2] < lanes or v.shape[-1] < lanes:
        return
    f = v.func
    fv = loop_vars(f)  # (depth, columns, batch...) innermost first
    f.compute_root().reorder_storage(fv[1], fv[0], *fv[2:])
    co, do, ci, di = (hl.Var(f"{name}_kt") for name in ("co", "do", "ci", "di"))
    f.tile(fv[1], fv[0], co, do, ci, di, lanes, lanes, hl.TailStrategy.GuardWithIf).vectorize(ci).unroll(di)
    if len(fv) > 2 and parallel_worthwhile(params, v.shape):
        f.parallel(fv[2])


def _tile_depthwise(acc: Accumulator, home: hl.Func, params: CpuParams, parallel: bool = True,
                    whole_map: bool = True, unroll_rows: bool = True, per_tile: list[Value] = ()) -> None:
    """Channels x pixels, the taps unrolled (one row at a time, whatever `whole_map` says)."""
    channels, pixels = depthwise_tile(acc, params)
    register_tile(home, acc, params, channels, pixels, None, unroll_taps=True,
                   round_up_channels=True, parallel=parallel, unroll_rows=unroll_rows, per_tile=per_tile)


def _tile_conv(acc: Accumulator, home: hl.Func, params: CpuParams, parallel: bool = True,
               whole_map: bool = True, unroll_rows: bool = True, per_tile: list[Value] = ()) -> None:
    """Channels x pixels; RDom (ky, kx, ci) loops ci innermost, then kx, then ky (a filter row's
    taps, (ky, row), for a narrow-input dot-product conv). `whole_map`: a tiny map in one tile
    (not where a conv chain computes the map a row at a time)."""
    innermost_first = list(reversed(range(acc.rdom.dimensions())))
    register_tile(home, acc, params, params.conv_channels, params.conv_pixels, innermost_first,
                   unroll_taps=False, round_up_channels=True, parallel=parallel, whole_map=whole_map,
                   unroll_rows=unroll_rows, per_tile=per_tile)


def tile_for(acc: Accumulator, home: hl.Func, params: CpuParams, parallel: bool = True,
              whole_map: bool = True, unroll_rows: bool = True, per_tile: list[Value] = ()) -> None:
    """A convolution's register tile, by its kind (`unroll_rows`, `per_tile`: register_tile)."""
    CONV_TILES[acc.kind](acc, home, params, parallel, whole_map, unroll_rows, per_tile)


# The register tile of each convolution kind (a conv chain streams only these).
CONV_TILES = {AccumulatorKind.CONV: _tile_conv, AccumulatorKind.DEPTHWISE: _tile_depthwise}
