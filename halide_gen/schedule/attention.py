"""An attention core (scores, softmax, weights x values) computed a tile of query rows at a time,
so that its score matrix never exists whole, as one parallel loop over the heads' row tiles; below
CpuParams.attention_whole_bytes of scores, a stage at a time instead."""

from __future__ import annotations

import numpy as np

from ..block import Accumulator, BlockKernel
from ..lower import AccumulatorKind
from ..values import Value
from .params import CpuParams
from .tiles import dividing_size
from .register_tile import home_of, materialize_prologue, register_tile
from .vectors import loop_vars, vectorize_helper


def attention_core(kernel: BlockKernel, params: CpuParams) -> tuple[Accumulator, Accumulator, list[Value]] | None:
    """(scores, weights x values, the stages per row tile) of a block that is an attention core
    (fusion.table3.attention_allowed) whose scores outgrow params.attention_whole_bytes: two float
    matrix products, the second reading the softmax of the first's result (through elementwise ops) as
    its left operand, with none of the scores, their softmax or its helpers a block output. Else
    None."""
    softmax = [k for k, op in enumerate(kernel.ops) if op.name == "SOFTMAX"]
    products = [a for a in kernel.accumulators if a.kind == AccumulatorKind.MATMUL and not a.dot and not a.narrow]
    if len(softmax) != 1 or len(products) != 2 or len(kernel.accumulators) != 2:
        return None
    (s,), (scores, weights) = softmax, products
    if not scores.op_index < s < weights.op_index or kernel.ops[weights.op_index].inputs[0] is not kernel.ops[s].outputs[0]:
        return None
    if len(weights.value.shape) < 3 or tuple(kernel.ops[s].outputs[0].shape)[:-1] != tuple(weights.value.shape)[:-1]:
        return None
    if 4 * int(np.prod(scores.value.shape)) <= params.attention_whole_bytes:
        return None
    if params.weight_cache_bytes and keys_and_values_bytes(scores, weights) > params.weight_cache_bytes:
        return None
    stages = _attention_stages(kernel, scores, s)
    if any(kernel.is_output(v.func) for v in stages):
        return None
    return scores, weights, stages


def keys_and_values_bytes(scores: Accumulator, weights: Accumulator) -> int:
    """What each row tile of an attention core reads whole: one head's keys and values. A tile of 12
    query rows re-reads them all; where they outgrow the cache a product's weights stay in
    (CpuParams.weight_cache_bytes), the stages one at a time, each a product tiled for its own
    operands, are faster (a Gemma head of 256 over 1024 keys, 2 MB; heads of 64 the other way round:
    bench/RESULTS.md, "Grouped-query attention fused whole")."""
    keys, depth = scores.value.shape[-1], int(np.prod(scores.extents))
    return 4 * keys * (depth + weights.value.shape[-1])


def _attention_stages(kernel: BlockKernel, scores: Accumulator, softmax: int) -> list[Value]:
    """The Funcs an attention core computes per row tile of its second product: the scores, the
    softmax's helpers (row maxima, exponentials, sums: their partials too) and the softmax itself.
    The elementwise ops between (scale, mask) stay inlined into them."""
    helpers = [h for k in range(scores.op_index, softmax + 1) for h in kernel.op_helpers[k]]
    return [scores.value, *helpers, kernel.op_values[softmax][0]]


def query_tile_rows(queries: int, most: int) -> int:
    """Query rows per tile: the most, down to half of `most`, that divide `queries`, else `most`.
    A last tile of fewer rows made every tile's stages loops of a run-time length: 12 rows ran 128
    and 512 queries 1.23-1.27x XNNPACK's time, 8 rows 1.01 and 0.82; 300 queries the other way round
    (bench/RESULTS.md, "Attention at the lengths models ship"). Where none divides, the last tile
    shifts back over rows its neighbour computes (register_tile's shift_last_rows): a few rows computed
    twice, every tile the same size."""
    return dividing_size(queries, most)


def schedule_attention(kernel: BlockKernel, core: tuple[Accumulator, Accumulator, list[Value]],
                        params: CpuParams, vectorized: set[str]) -> set[int]:
    """The attention core in one pass over tiles of query rows: the second product (weights x
    values) tiled rows outside channels, and at each row tile the scores of those rows (their own
    register tiles), the softmax's statistics and the weights computed once, serially, in a few KB
    (rows x keys) that stay in L1: the [heads, queries, keys] matrix is never stored whole. Returns
    id() of the Funcs it scheduled."""
    scores, weights, stages = core
    for acc in (scores, weights):
        materialize_prologue(kernel, acc, params, vectorized)  # transposed queries, keys, values
    home = home_of(kernel, weights)
    tile_rows = query_tile_rows(weights.value.shape[-2], params.attention_rows or params.mm_rows)
    row_loop, rows = register_tile(home, weights, params, params.mm_channels, tile_rows, None,
                                    unroll_taps=False, round_up_channels=False, rows_outer=True,
                                    shift_last_rows=True)
    register_tile(scores.value.func, scores, params, params.mm_channels, tile_rows, None,
                   unroll_taps=False, round_up_channels=False, parallel=False)
    terms = {id(r.partial.func) for r in kernel.row_reductions}
    for v in stages:
        # A constant size (the last row tile is shorter): on the stack, not a heap allocation per tile.
        v.func.compute_at(home, row_loop).bound_storage(loop_vars(v.func)[1], rows)
        if v is not scores.value:
            vectorize_helper(v, params, vectorized, id(v.func) in terms)
    return {id(home), *(id(v.func) for v in stages)}
