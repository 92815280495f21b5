"""The GPU schedule family (OpenCL and Vulkan): every materialised Func is one kernel launch that
covers all of it — its two innermost dimensions (TFLite's C and W) tiled into 16 x 16 work-groups,
the outer ones (H, N, ...) fused into the grid's third dimension — and everything else is inlined
into those kernels. A phone GPU pays 5-20 us per launch and more per device allocation, so:

- a convolution's or matrix product's accumulator is computed per thread, inside the launch of
  the Func that reads it (its init and its reduction loop in registers: no launch, no buffer);
- the zero-padded input a CPU template materialises for a convolution is inlined: a GPU re-reads
  and re-selects cheaply, and it saves a launch;
- other helpers (statistics, a softmax's exps, ARG_MAX's tuples) keep their own launch, update
  included;
- what stays materialised besides the outputs is listed as the kernel's scratch
  (BlockKernel.scratch): aot.py makes them extra outputs whose buffers the delegate allocates once
  per partition, so no invoke after the first asks the device for memory (Halide's OpenCL runtime
  keeps no allocation cache; on Vulkan, buffers under 64 bytes stay the kernel's: aot.py says why).

Innermost-axis reductions (softmax and normalisation statistics, reductions over C) run in
shared memory: a work-group takes ROWS rows, its 16 x ROWS threads each fold one 16-lane partial
sum (lane k reads elements k, k+16, ...: neighbouring threads read neighbouring addresses) into
GPU shared memory, and ROWS threads then fold the 16 partials of their row — one launch, and the
partials never touch global memory.
"""

from __future__ import annotations

import halide as hl

from fusion.mapping import MtM, OtO, op_mapping

from ..block import BlockKernel
from ..values import Value

TILE = 16
ROWS = 16  # rows of a row reduction per work-group


def _tile(extent: int, preferred: int) -> int:
    """The tile size for an extent: the preferred size, or the whole extent when smaller."""
    return max(1, min(preferred, extent))


def _gpu_tile(f: hl.Func, extents: list[int], stage=None) -> None:
    """gpu_tile over the innermost one or two dimensions.

    Pure definitions use ShiftInwards: a partial last tile is shifted back inside the extent
    (recomputing a few elements) rather than guarded by an `if` in every thread.
    """
    target = stage if stage is not None else f
    names = [a.name() for a in f.args()]
    if not names:
        target.gpu_single_thread()
        return
    # Update definitions cannot recompute elements (a += would run twice): guard those instead.
    shift = hl.TailStrategy.GuardWithIf if stage is not None else hl.TailStrategy.ShiftInwards
    if len(names) == 1:
        x, xo, xi = hl.Var(names[0]), hl.Var(names[0] + "_o"), hl.Var(names[0] + "_i")
        target.gpu_tile(x, xo, xi, _tile(extents[0], TILE * TILE), shift)
        return
    c, x = hl.Var(names[0]), hl.Var(names[1])
    co, ci, xo, xi = (hl.Var(n) for n in (names[0] + "_o", names[0] + "_i", names[1] + "_o", names[1] + "_i"))
    target.gpu_tile(c, x, co, xo, ci, xi, _tile(extents[0], TILE), _tile(extents[1], TILE), shift)
    if len(names) > 2:
        # The rows (and batches) are the grid's third dimension: left as a loop they would run on
        # the host, one launch per row.
        outer = hl.Var(names[2])
        for k, name in enumerate(names[3:]):
            fused = hl.Var(f"{names[2]}_{k}_fused")
            target.fuse(outer, hl.Var(name), fused)
            outer = fused
        target.gpu_blocks(outer)


def _innermost_thread(f: hl.Func) -> hl.Var:
    """The innermost thread loop _gpu_tile gives `f`: computed there, a producer is one thread's."""
    names = [a.name() for a in f.args()]
    return hl.Var(names[0] + "_i")


def _row_reduction_in_shared_memory(partial: Value, total: Value) -> None:
    """Rows of `total` across work-groups, its 16-lane `partial` in the group's shared memory."""
    t, p = total.func, partial.func
    names = [a.name() for a in t.args()]  # c (extent 1), then the row dimensions x, y, ...
    x, xo, xi = hl.Var(names[1]), hl.Var(names[1] + "_o"), hl.Var(names[1] + "_i")
    rows = _tile(total.shape[-2], ROWS)
    t.compute_root().split(x, xo, xi, rows, hl.TailStrategy.ShiftInwards)
    if len(names) > 2:
        t.gpu_blocks(xo, hl.Var(names[2])).gpu_threads(xi)
    else:
        t.gpu_blocks(xo).gpu_threads(xi)
    lane, px = (hl.Var(a.name()) for a in p.args()[:2])
    # Computed at the block loop, a Func lives in the work-group's shared memory.
    p.compute_at(t, xo).gpu_threads(lane, px)


def _landing(kernel: BlockKernel, f: hl.Func) -> hl.Func:
    """The launched Func that computes `f`: `f` itself, or the output whose copy it is inlined into."""
    if kernel.inline_into_output(f):
        for _, v in kernel.outputs:
            if v.func is f or kernel.copied_from.get(id(v.func)) is f:
                return v.func
    return f


def _elementwise_landing(kernel: BlockKernel, op_index: int) -> hl.Func | None:
    """The output Func an op's result reaches through a chain of elementwise ops, each its
    predecessor's only reader and of its shape (a projection conv, then the residual ADD that is
    the block's output); None when it does not. Inlined along that chain, the result is computed
    once per output element, so its accumulator can live in the output's threads."""
    t = kernel.ops[op_index].outputs[0]
    while True:
        readers = [j for j, op in enumerate(kernel.ops) if any(x is t for x in op.inputs)]
        if len(readers) != 1:
            return None
        op = kernel.ops[readers[0]]
        if op_mapping(op) != OtO or tuple(op.outputs[0].shape) != tuple(t.shape):
            return None
        value = kernel.op_values[readers[0]][0]
        if kernel.inline_into_output(value.func):
            return _landing(kernel, value.func)
        t = op.outputs[0]


def schedule_gpu(kernel: BlockKernel) -> None:
    """Applies the GPU schedule in place."""
    shared = {id(f.func) for r in kernel.row_reductions for f in (r.partial, r.total)}
    for partial, total, _ in kernel.row_reductions:
        _row_reduction_in_shared_memory(partial, total)
        kernel.scratch.append(total)
    # Padded inputs are inlined (their realised region exceeds their tensor, so they could not be
    # scratch buffers of its shape anyway); every other helper holds a reduction or is read by one
    # (a softmax's exps: inlined, Vulkan's 1000-wide rows came out wrong) and stays.
    padded = {id(v.func) for v, _ in kernel.padded}
    roots = [v for v in kernel.materialize if id(v.func) not in shared and id(v.func) not in padded]
    # What reads an accumulator is launched (it computes the accumulator in its threads), unless
    # it only feeds the output through elementwise ops: then the output's threads compute it.
    landings = {id(a.value.func): _elementwise_landing(kernel, a.op_index) for a in kernel.accumulators}
    roots += [a.value for a in kernel.accumulators
              if not kernel.inline_into_output(a.value.func) and landings[id(a.value.func)] is None]
    for op, values in zip(kernel.ops, kernel.op_values):
        if op_mapping(op) == MtM:
            roots += [v for v in values if not kernel.inline_into_output(v.func) and landings.get(id(v.func)) is None]
    roots += [v for v in kernel.broadcast_sources() if not kernel.inline_into_output(v.func)]
    seen = set(shared)
    for v in roots + [v for _, v in kernel.outputs]:
        f = v.func
        if id(f) in seen:
            continue
        seen.add(id(f))
        if not kernel.inline_into_output(f) and not any(f is o.func for _, o in kernel.outputs):
            f.compute_root()
            # A scratch output is one buffer: a Tuple (an ARG_MAX's values and indices) stays the
            # kernel's own allocation.
            if f.outputs() == 1:
                kernel.scratch.append(v)
        # A helper's realized region can exceed its nominal shape (a padded input), never fall
        # short of it, so tiles sized from the shape always fit.
        shape = list(reversed(v.shape))
        _gpu_tile(f, shape)
        for k in range(f.num_update_definitions()):
            _gpu_tile(f, shape, f.update(k))
    for a in kernel.accumulators:
        landing = landings[id(a.value.func)] or _landing(kernel, a.value.func)
        a.acc.compute_at(landing, _innermost_thread(landing))
