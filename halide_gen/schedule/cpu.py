"""CPU schedule templates (x86 AVX2 / AVX-512 and ARM NEON): which template schedules each Func of
a block kernel, and what no template covers.

* Convolutions and matrix products: a register tile of output channels (innermost, vectorized) x
  pixels or rows (unrolled), the accumulator computed at the tile and the reduction loops outside
  it (register_tile.py; its shape from the tile model, tiles.py; the numbers per CPU family in
  params.py). A chain of convolutions whose intermediates outgrow the cache streams through row
  buffers (conv_chain.py); an attention core runs in tiles of query rows (attention.py; on NEON
  only past 1 MB of scores).
* A matrix product scaled per block of its depth (weights quantized per block): the same tile
  with each block's int32 sums computed at each step over the blocks (blockwise.py).
* Depthwise convolutions: channels x pixels with the taps unrolled. A convolution reads its zero
  padding inline where its input is in memory anyway, the bounds test `likely` so that Halide's
  loop partitioning leaves it on the border tiles only (padding_inlined says where not).
* A block of row statistics and the elementwise work reading them (LayerNorm, softmax) computes
  a tile of rows at a time, every stage inside one parallel loop over the tiles (row_tiles.py).
* Parallelism in coarse tasks over rows, rows times groups of channel tiles, channel tiles times
  heads, a matrix product's channel tiles times groups of its rows where its channel tiles are
  few (its row tiles alone where its weights fit L1), bands of a large map's rows for a sum over
  it; none for a stage too small to repay handing tasks to the pool (CpuParams.parallel_work).
  The threads are the delegate's pool's (delegate/src/thread_pool.cc), their count set at run time.
* Everything else is vectorized along TFLite's innermost axis (vectors.py).

Weights arrive packed (halide_gen.pack) with the channel axis padded to pack.CHANNEL_TILE, so a tile
that runs past the last channel reads zeros that exist instead of guarding every vector.
"""

from __future__ import annotations

import halide as hl
import numpy as np

from fusion.mapping import MtM, op_mapping

from ..block import Accumulator, BlockKernel
from ..lower import AccumulatorKind
from ..values import Value
from .attention import attention_core, schedule_attention
from .blockwise import schedule_blockwise
from .conv_chain import conv_chain, schedule_conv_chain
from .params import ROW_TASKS, X86, CpuParams
from .register_tile import exponential_epilogue, home_of, materialize_prologue, register_tile, tile_for
from .row_tiles import row_tiled_stages, schedule_row_statistics, schedule_row_tiles
from .tiles import depthwise_tile, reads_in_groups
from .vectors import loop_vars, split_rows, tile_transpose, vectorize_helper, vectorize_inner


def padding_inlined(kernel: BlockKernel, params: CpuParams) -> set[int]:
    """id() of the zero-padded inputs the convolutions read inline (BlockKernel.padding_read_in_place),
    except where
    - a tile reads its input in groups: the wrapper computed per group would keep the bounds test
      in the innermost loop, out of loop partitioning's reach (NEON's 4-step float tiles and SDOT
      groups);
    - a depthwise tile's channels run past the last one of an input that cannot be read there (a
      block input with MobileNetV3's 72, 88 or 120 channels, in 16-channel tiles): the channel
      clamp that keeps those reads inside the input turns every tap's vector load into a gather;
      a copy clamps once per element. A convolution's result in the block can be read past its
      last channel (Value.readable_channels): no clamp, no copy;
    - the filter's window is wider or taller than the map it slides over (a 6x6 int8 depthwise on a
      1x3 map), or an int8 depthwise filter that sums its taps in pairs has an even side (4x4,
      6x6): Halide's bounds inference then asked the input for a column before its first (from a
      select whose condition it had used to drop the clamp), and the kernel could only fail its
      bounds check. Odd filters, the ones models use, keep their padding inline."""
    copied = set()
    for acc in kernel.accumulators:
        helpers = kernel.op_helpers[acc.op_index]
        channels = acc.value.shape[-1]
        tile = depthwise_tile(acc, params)[0]
        ragged = (acc.kind == AccumulatorKind.DEPTHWISE and channels % tile
                  and any(h.readable_channels < -(-channels // tile) * tile for h in helpers))
        op = kernel.ops[acc.op_index]
        if ragged or reads_in_groups(acc, params) or _window_outgrows_map(op) or (acc.narrow and _even_filter(op)):
            copied |= {id(h.func) for h in helpers}
    return kernel.padding_read_in_place() - copied


def _even_filter(op) -> bool:
    """Whether a 2-D convolution's filter has an even height or width."""
    return op.name in ("CONV_2D", "DEPTHWISE_CONV_2D") and any(k % 2 == 0 for k in op.inputs[1].shape[1:3])


def _window_outgrows_map(op) -> bool:
    """Whether a 2-D convolution's (dilated) filter is wider or taller than its input map."""
    if op.name not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return False
    _, kh, kw, _ = op.inputs[1].shape
    _, h, w, _ = op.inputs[0].shape
    dh, dw = (int(getattr(op.options, f"dilation{a}Factor", 1) or 1) for a in "HW")
    return (kh - 1) * dh + 1 > h or (kw - 1) * dw + 1 > w


def _schedule_outer_reduction(acc: Accumulator, params: CpuParams) -> None:
    """Sums over outer axes (global average pooling): the accumulator at the root, vectorized along
    the kept innermost axis, in chunks of up to 8 vectors that stay in registers while the
    reduction loops run inside the chunk: a load and an add per vector, where with the reduction
    outermost the accumulator goes through memory. A sum over a large map (BANDED_SUM_WORK) first
    sums bands of its outermost reduced axis in parallel (_parallel_bands), then adds up the bands."""
    f = acc.acc
    f.compute_root()
    lanes = params.lanes
    channels = acc.value.shape[-1] if acc.value.shape else 1
    rvars = [acc.rdom[k] for k in reversed(range(acc.rdom.dimensions()))]  # innermost reduced axis first
    bands = None
    if channels >= lanes and int(np.prod(acc.extents)) * channels >= BANDED_SUM_WORK:
        bands = _parallel_bands(acc)
    if bands is None:
        _vectorize_outer_sum(f, rvars, channels, lanes)
        return
    band_rows, band, axis = bands
    inner = [hl.RVar("band_i") if k == axis else acc.rdom[k] for k in reversed(range(acc.rdom.dimensions()))]
    _vectorize_outer_sum(band_rows, inner, channels, lanes)
    band_rows.update().parallel(band)
    c = loop_vars(f)[0]
    f.vectorize(c, lanes, hl.TailStrategy.GuardWithIf)
    f.update().vectorize(c, lanes, hl.TailStrategy.GuardWithIf)


# Elements summed (map pixels x channels) from which a sum over a map is split into bands: the
# bands' partials and their final pass cost more than they share on EfficientNet's 7x7 to 28x28
# pools (63-188 K elements, 1.1-1.5x XNNPACK's time at one thread), and repay it on a 56x56x144 one.
BANDED_SUM_WORK = 1 << 18


def _parallel_bands(acc: Accumulator) -> tuple[hl.Func, hl.Var, int] | None:
    """Partial sums over bands of the outermost reduced axis longer than 1 (ROW_TASKS bands at
    most, each the same height), as a Func, its band variable and that axis: each band a task. A
    sum over a map on one thread ran SegFormer's [128, 128, 256] at 1.3x XNNPACK's time at two
    threads. None where the axis has no band height that splits it into 2 bands or more."""
    axis = next((k for k, extent in enumerate(acc.extents) if extent > 1), None)
    if axis is None:
        return None
    rows = acc.extents[axis]
    height = next((h for h in range(1, rows) if rows % h == 0 and rows // h <= ROW_TASKS), rows)
    if rows // height < 2:
        return None
    outer, inner, band = hl.RVar("band_o"), hl.RVar("band_i"), hl.Var("band")
    acc.acc.update().split(acc.rdom[axis], outer, inner, height)
    band_rows = acc.acc.update().rfactor(outer, band)
    band_rows.compute_root()
    return band_rows, band, axis


def _vectorize_outer_sum(f: hl.Func, rvars: list, channels: int, lanes: int) -> None:
    """An outer sum's update vectorized along its innermost variable, in chunks of up to 8 vectors
    with the reduction (`rvars`, innermost first) inside each chunk."""
    fv = loop_vars(f)
    c = fv[0]
    update = f.update()
    if channels < lanes:
        update.reorder([hl.VarOrRVar(c)] + [hl.VarOrRVar(r) for r in rvars] + [hl.VarOrRVar(v) for v in fv[1:]])
        return
    f.vectorize(c, lanes, hl.TailStrategy.GuardWithIf)
    chunk = min(8 * lanes, -(-channels // lanes) * lanes)
    outer, inner = hl.Var(c.name() + "_o"), hl.Var(c.name() + "_i")
    update.split(c, outer, inner, chunk, hl.TailStrategy.GuardWithIf)
    update.reorder([hl.VarOrRVar(inner)] + [hl.VarOrRVar(r) for r in rvars]
                   + [hl.VarOrRVar(outer)] + [hl.VarOrRVar(v) for v in fv[1:]])
    update.vectorize(inner, lanes).unroll(inner)


def _template_reduce(kernel: BlockKernel, acc: Accumulator, params: CpuParams, tiled: set[int],
                     per_tile: list[Value]) -> None:
    """A sum over outer axes: vectorized along the untouched innermost axis."""
    _schedule_outer_reduction(acc, params)


def _template_conv(kernel: BlockKernel, acc: Accumulator, params: CpuParams, tiled: set[int],
                   per_tile: list[Value]) -> None:
    """A convolution in a register tile of its consumer (the op's output); `per_tile`: register_tile's."""
    home = home_of(kernel, acc)
    tiled.add(id(home))
    tile_for(acc, home, params, unroll_rows=not exponential_epilogue(kernel, acc), per_tile=per_tile)


def _template_matmul(kernel: BlockKernel, acc: Accumulator, params: CpuParams, tiled: set[int],
                     per_tile: list[Value]) -> None:
    """A matrix product in a register tile of rows x output channels."""
    home = home_of(kernel, acc)
    tiled.add(id(home))
    op = kernel.ops[acc.op_index]
    packed = any(a.pack for a in kernel.arguments if a.tensor in op.inputs)
    weights = next((a.tensor for a in kernel.arguments if a.pack and a.tensor is op.inputs[1]), None)
    small = (weights is not None and acc.acc.type().is_float()
             and 4 * int(np.prod(weights.shape)) <= params.small_weight_bytes)
    # A float product of two activations with no epilogue (its own Func, or a block output copying
    # it): computing a few channels twice computes nothing elementwise twice.
    own = home is acc.value.func or kernel.copied_from.get(id(home)) is acc.value.func
    plain = op.name == "BATCH_MATMUL" and own and acc.acc.type().is_float() and not packed
    register_tile(home, acc, params, params.mm_channels, params.mm_rows, None, unroll_taps=False,
                   round_up_channels=packed, unroll_rows=not exponential_epilogue(kernel, acc), rows_outer=small,
                   shift_last_channels=plain)


def _template_blockwise(kernel: BlockKernel, acc: Accumulator, params: CpuParams, tiled: set[int],
                        per_tile: list[Value]) -> None:
    """A matrix product scaled per block of its depth (blockwise.py)."""
    home = home_of(kernel, acc)
    tiled.add(id(home))
    schedule_blockwise(home, acc, params, params.mm_channels)


# The template that schedules each kind of accumulator (halide_gen.lower.AccumulatorKind).
TEMPLATES = {AccumulatorKind.CONV: _template_conv, AccumulatorKind.DEPTHWISE: _template_conv,
             AccumulatorKind.MATMUL: _template_matmul, AccumulatorKind.REDUCE: _template_reduce,
             AccumulatorKind.BLOCKWISE: _template_blockwise}


def _roots(kernel: BlockKernel, streamed: set[int]) -> list[Value]:
    """Many-to-Many results no template covers, and small results read broadcast (computed once, not
    once per element of their consumer): what is computed at the root besides the helpers."""
    roots = [v for k, (op, values) in enumerate(zip(kernel.ops, kernel.op_values))
             if op_mapping(op) == MtM and not any(a.op_index == k for a in kernel.accumulators)
             for v in values if not kernel.inline_into_output(v.func) and id(v.func) not in streamed]
    return roots + [v for v in kernel.broadcast_sources() if not kernel.is_output(v.func) and id(v.func) not in streamed]


def schedule_slice_update(f: hl.Func, params: CpuParams) -> None:
    """An output of a kernel's in-place form (halide_gen.block.build_block): its update, a token's
    keys or values at most a prompt's, written along its innermost axis in vectors on one thread;
    the rest of the output is the caller's memory, not computed."""
    f.update(0).vectorize(f.rvars(0)[0], params.lanes, hl.TailStrategy.GuardWithIf)


def schedule_cpu(kernel: BlockKernel, params: CpuParams = X86) -> None:
    """Applies the CPU templates in place; what no template covers is computed at the root
    (Many-to-Many results) or inlined, and vectorized along the innermost axis."""
    chain = conv_chain(kernel, params.stream_bytes)
    in_place = padding_inlined(kernel, params)
    vectorized: set[str] = set()  # (vectorize_inner)
    streamed = schedule_conv_chain(kernel, chain, params, in_place, vectorized) if chain else set()
    core = None if chain else attention_core(kernel, params)
    if core:
        streamed = schedule_attention(kernel, core, params, vectorized)
    terms = {id(r.partial.func): r.terms for r in kernel.row_reductions}
    light = not kernel.accumulators
    rows = row_tiled_stages(kernel, [*kernel.materialize, *_roots(kernel, streamed)], params.lanes) if light else None
    if rows:
        streamed = schedule_row_tiles(kernel, rows, params, vectorized, set(terms))
    # Zero-padded copies move data only: several vectors a step, as block outputs take.
    copies = {id(p.func) for p, _ in kernel.padded}
    statistics = schedule_row_statistics(kernel, params, vectorized, set(terms), streamed | in_place)
    for v in kernel.materialize:
        if id(v.func) in streamed or id(v.func) in in_place or id(v.func) in statistics:
            continue
        f = v.func
        f.compute_root()
        vectorize_helper(v, params, vectorized, id(f) in terms, copy=id(f) in copies)
        split_rows(f, v.shape, params, terms.get(id(f), 1), light)
    tiled = set(streamed)
    # A conv chain's or an attention core's accumulators were scheduled with it, above.
    for acc in [] if chain or core else kernel.accumulators:
        per_tile = materialize_prologue(kernel, acc, params, vectorized)
        if acc.kind not in TEMPLATES:
            raise ValueError(f"no CPU schedule template for {acc.kind}")
        TEMPLATES[acc.kind](kernel, acc, params, tiled, per_tile)
    rooted = {id(v.func) for v in kernel.materialize} | {id(a.value.func) for a in kernel.accumulators} | tiled
    for v in _roots(kernel, streamed):
        if id(v.func) not in rooted:
            v.func.compute_root()
            vectorize_inner(v.func, v.shape, params, vectorized, unrolled=v.unrollable, joins=v.joins)
            rooted.add(id(v.func))
            # Split across threads like the helpers above (an attention core's softmax, read by
            # its second product, is no lighter for being a root).
            split_rows(v.func, v.shape, params, light=light)
    for tensor, v in kernel.outputs:
        if id(v.func) in tiled or not tensor.shape:
            continue
        f = v.func
        if f.has_update_definition():  # an in-place form's slice update: the update alone is written
            schedule_slice_update(f, params)
            continue
        # A transposed output (a decoder's K^T beside its cache) in square tiles, not gathers.
        if not tile_transpose(v, params, vectorized):
            vectorize_inner(f, tensor.shape, params, vectorized, unrolled=True, joins=v.joins)
        split_rows(f, tensor.shape, params, light=light)
