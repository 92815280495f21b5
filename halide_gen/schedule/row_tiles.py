"""A block of row-wise stages (a LayerNorm, an RMSNorm, a softmax: statistics of each row, then
elementwise work that reads them) computed a tile of rows at a time: each tile's statistics and
results in L1, all of them inside one parallel loop over the tiles.

A stage at a time instead, every stage was a pass over the whole tensor, and the small ones (a
row's mean from its partial sums) ran on one thread between the parallel ones: SegFormer's
LayerNorms over 16384 rows of 32 channels took as long at two threads as at one, and a softmax
over [12, 512, 512] 2.4x XNNPACK's time (bench/RESULTS.md, "Real-size corpus: speed")."""

from __future__ import annotations

import halide as hl
import numpy as np

from ..block import BlockKernel
from ..values import Value
from .params import CpuParams
from .tiles import dividing_size, parallel_worthwhile
from .vectors import fuse_outward, loop_vars, row_axis, split_rows, vectorize_helper, vectorize_inner

# Vectors a step of a row statistic's root (its per-row partial results) reduces side by side.
ROOT_VECTORS = 4

# Bytes of the widest stage one tile of rows holds: with the row statistics, well inside L1.
ROW_TILE_BYTES = 16 << 10


def row_tiled_stages(kernel: BlockKernel, stages: list[Value], lanes: int) -> dict[int, list[Value]] | None:
    """Output index -> the stages computed per row tile of that output, for a block with no matrix
    product or convolution whose every stage at the root (`stages`: helpers and Many-to-Many
    results) lies behind exactly one output, over that output's rows (the same shape but the
    innermost axis), reached other than through another output's buffer. None where any does not
    (a reshape between a statistic and the output, a stage two outputs read), or where no output
    has stages; such blocks keep a stage at a time."""
    if kernel.accumulators or not stages:
        return None
    owner = _stage_ops(kernel)
    output_ids = {id(t) for t, _ in kernel.outputs}
    producer = {id(t): k for k, op in enumerate(kernel.ops) for t in op.outputs}
    claimed: dict[int, int] = {}  # op index -> output index
    for index, (tensor, _) in enumerate(kernel.outputs):
        for k in _ops_behind(kernel, tensor, producer, output_ids):
            if claimed.setdefault(k, index) != index:
                return None
    tiled: dict[int, list[Value]] = {}
    for v in {id(v.func): v for v in stages}.values():
        k = owner.get(id(v.func))
        if k is None or k not in claimed:
            return None
        tiled.setdefault(claimed[k], []).append(v)
    for index, values in tiled.items():
        shape = tuple(kernel.outputs[index][0].shape)
        if len(shape) < 2 or shape[-1] < lanes or any(
                len(v.shape) != len(shape) or tuple(v.shape[:-1]) != shape[:-1] for v in values):
            return None
    return tiled


def _stage_ops(kernel: BlockKernel) -> dict[int, int]:
    """id() of each helper's and op result's Func -> the op that defines it."""
    owner = {}
    for k, (helpers, values) in enumerate(zip(kernel.op_helpers, kernel.op_values)):
        for v in (*helpers, *values):
            owner.setdefault(id(v.func), k)
    return owner


def _ops_behind(kernel: BlockKernel, tensor, producer: dict[int, int], output_ids: set[int]) -> set[int]:
    """The ops `tensor` is computed from (`producer`: id() of each op output -> the op), back to the
    block's inputs or another output (read from that output's buffer, not recomputed)."""
    seen: set[int] = set()
    pending = [tensor]
    while pending:
        k = producer.get(id(pending.pop()))
        if k is None or k in seen:
            continue
        seen.add(k)
        pending += [t for t in kernel.ops[k].inputs if t is not None and id(t) not in output_ids]
    return seen


def tile_rows(shape, element_bytes: int = 4) -> tuple[int, int]:
    """(rows of `shape`'s innermost row axis, rows of the next axis) per tile: about ROW_TILE_BYTES
    of rows, a divisor of the axis where one is at least half that (no tail tile), whole rows of
    the next axis where the innermost one is smaller (a tile of one short axis is a loop of a few
    steps, which LLVM unrolled whole, its exponentials spilling)."""
    extent, outer = int(shape[-2]), int(shape[-3]) if len(shape) > 2 else 1
    target = max(1, ROW_TILE_BYTES // (element_bytes * int(shape[-1])))
    if target >= extent:
        return extent, dividing_size(outer, max(1, min(outer, target // extent)))
    return dividing_size(extent, target), 1


def schedule_row_tiles(kernel: BlockKernel, tiled: dict[int, list[Value]], params: CpuParams,
                       vectorized: set[str], partials: set[int]) -> set[int]:
    """Each output of `tiled` (row_tiled_stages) in tiles of rows, its stages computed per tile
    (`partials`: id() of the row reductions' partial-result Funcs, vectorize_helper's); the tiles,
    times the outer axes, one parallel loop. Returns id() of every Func scheduled."""
    done: set[int] = set()
    for index, stages in tiled.items():
        tensor, out = kernel.outputs[index]
        shape = tuple(tensor.shape)
        f = out.func
        vectorize_inner(f, shape, params, vectorized, unrolled=True, joins=out.joins)
        v = loop_vars(f)
        rows, outer_rows = tile_rows(shape)
        task, rest = v[1], v[2:]
        if rows < shape[-2]:
            task, inner = hl.Var(v[1].name() + "_tile"), hl.Var(v[1].name() + "_row")
            f.split(v[1], task, inner, rows, hl.TailStrategy.GuardWithIf)
        elif outer_rows > 1:
            task, inner = hl.Var(v[2].name() + "_tile"), hl.Var(v[2].name() + "_row")
            f.split(v[2], task, inner, outer_rows, hl.TailStrategy.GuardWithIf)
            rest = v[3:]
        task = fuse_outward(f, task, rest)
        if parallel_worthwhile(params, shape, light=True):
            f.parallel(task)
        for stage in stages:
            # A constant size: on the stack, not an allocation per tile.
            stage.func.compute_at(f, task).bound_storage(loop_vars(stage.func)[1], rows)
            vectorize_helper(stage, params, vectorized, id(stage.func) in partials)
            done.add(id(stage.func))
        done.add(id(f))
    return done


def schedule_row_statistics(kernel: BlockKernel, params: CpuParams, vectorized: set[str], partials: set[int],
                            skip: set[int]) -> set[int]:
    """Each of the kernel's RowStatistics (but those whose Funcs are in `skip`): its roots at the
    root, split among threads over their rows, then the rest in one loop over its rows, parallel
    where worthwhile: the results side by side in it (compute_with), the reductions behind them
    computed per row inside it (`partials`: as in schedule_row_tiles). Stage by stage, each
    reduction was a pass of its own and each fold a loop on one thread between the parallel ones:
    a dynamic-range FC's row extremes took 7 % of its time. Returns id() of every Func scheduled."""
    done: set[int] = set()
    for stats in kernel.row_statistics:
        if any(id(v.func) in skip for v in (*stats.results, *stats.inner, *stats.roots)):
            continue
        rows = int(np.prod(stats.results[0].shape))
        for v in stats.roots:
            f = v.func
            f.compute_root()
            # Four vectors a step: each lane a chain of its own along the pixels it reduces.
            f.vectorize(loop_vars(f)[0], min(v.shape[-1], ROOT_VECTORS * params.lanes))
            # Each value reduces this many of the row's elements.
            split_rows(f, v.shape, params, stats.depth * rows // int(np.prod(v.shape)))
            axis, first_root = row_axis(f, v.shape), stats.roots[0]
            if v is not first_root and v.shape == first_root.shape and axis is not None:
                f.compute_with(first_root.func, axis)  # an image's minima beside its maxima: one pass
            vectorized.add(f.name())
            done.add(id(f))
        parallel = parallel_worthwhile(params, stats.results[0].shape[:-1], stats.depth)
        first = level = None
        for v in stats.results:
            f = v.func
            f.compute_root()
            # Fused at the innermost row axis (a fused axis would give the reductions inside loose
            # bounds: every row, in every row's iteration), threads over the outermost (row_axis).
            axis = row_axis(f, v.shape)
            if parallel and axis is not None:
                f.parallel(axis)
            if first is None:
                first, level = f, loop_vars(f)[1]
            else:
                f.compute_with(first, level)
            done.add(id(f))
        for v in stats.inner:
            v.func.compute_at(first, level)
            vectorize_helper(v, params, vectorized, id(v.func) in partials)
            done.add(id(v.func))
    return done
