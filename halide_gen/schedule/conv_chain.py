"""A block of chained convolutions (an inverted residual) streamed through row buffers, so that
its large intermediates never exist whole."""

from __future__ import annotations

import halide as hl
import numpy as np

from fusion.mapping import ELEMENTWISE

from ..block import Accumulator, BlockKernel
from .params import X86, CpuParams
from .register_tile import CONV_TILES, quantizes_as_it_runs, tile_for
from .vectors import loop_vars, vectorize_inner


def conv_chain(kernel: BlockKernel, stream_bytes: int = X86.stream_bytes) -> list[Accumulator] | None:
    """The accumulators of a block that chains convolutions (MobileNet's inverted residual:
    pointwise -> depthwise -> pointwise, then bias / activation / residual add), or None."""
    accs = kernel.accumulators
    if len(accs) < 2 or any(a.kind not in CONV_TILES or len(a.value.shape) != 4 for a in accs):
        return None
    # The last convolution must feed only the elementwise epilogue of the block's one output
    # (bias, activation, residual ADD), which is then computed in its register tile: at the
    # convolution's own indices, so no index-shifting op (a CONCATENATION made a tile read channels
    # past the packed bias) and no broadcast to a larger shape.
    last = accs[-1].value.shape
    after = kernel.ops[accs[-1].op_index + 1:]
    if len(kernel.outputs) != 1 or any(op.name not in ELEMENTWISE or tuple(op.outputs[0].shape) != last for op in after):
        return None
    # A dynamic-range convolution quantizes its input by the whole image's extremes: past the
    # first, it needs the intermediate before it whole before any of its rows, and streamed, each
    # strip computed that intermediate again (bench/RESULTS.md, "ARM64: dynamic-range models").
    if any(quantizes_as_it_runs(kernel, a) for a in accs[1:]):
        return None
    # Streaming pays when the intermediates would not stay in cache (CpuParams.stream_bytes).
    intermediate = sum(4 * int(np.prod(a.value.shape)) for a in accs[:-1])
    return accs if intermediate >= stream_bytes else None


def schedule_conv_chain(kernel: BlockKernel, chain: list[Accumulator], params: CpuParams,
                         in_place: set[int], vectorized: set[str]) -> set[int]:
    """Streams a conv chain through row buffers: the output is cut into strips of rows (one
    parallel task each); within a strip, every earlier convolution (and the zero-padded copy
    the next one reads) is computed one row at a time into a sliding buffer that holds just the
    rows still needed (an expand conv's rows in a ring of a few, the depthwise conv in its own
    register tiles). A strip recomputes its halo rows, so tasks stay independent. Padding in `in_place`
    (cpu.padding_inlined) is read inline from the rows of the convolution before, not copied.

    Returns the ids of the Funcs it scheduled.
    """
    last = chain[-1]
    home = kernel.outputs[0][1].func  # the last conv and its epilogue inline into the output
    tile_for(last, home, params, parallel=False, whole_map=False)  # rows are split into strips below
    y = loop_vars(home)[2]
    yo, yi = hl.Var("y_strip"), hl.Var("y_row")
    rows = last.value.shape[1]
    strip = max(params.strip_rows, -(-rows // 4))
    home.split(y, yo, yi, strip, hl.TailStrategy.GuardWithIf).parallel(yo)
    done = {id(home)}
    for acc in chain[:-1]:
        f = acc.value.func
        f.store_at(home, yo).compute_at(home, yi)
        tile_for(acc, f, params, parallel=False, whole_map=False)
        done.add(id(f))
    for acc in chain[1:]:
        for helper in kernel.op_helpers[acc.op_index]:
            if id(helper.func) in in_place:
                continue  # the taps read the rows of the convolution before (padding_inlined)
            g = helper.func
            g.store_at(home, yo).compute_at(home, yi)
            vectorize_inner(g, helper.shape, params, vectorized, joins=helper.joins)
            done.add(id(g))
    return done
