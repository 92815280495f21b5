"""CPU schedule templates (x86 AVX2 / AVX-512 and ARM NEON), per block kind.

What measurements on the x86 host (AVX-512 EPYC, one thread, against XNNPACK) showed, and these
templates follow:

* Convolutions and matrix products: a register tile of output channels (innermost, vectorized)
  x pixels or rows (unrolled); the accumulator is computed at that tile, with the reduction loops
  outside it ("1x1 expand conv: 144 channels x 2 pixels, 18 accumulators -> 0.194 ms, XNNPACK
  0.194"; "dense 3x3 conv: reduction ordered ky, kx, input channel"). Tile shapes per target
  family are in CpuParams, each with the measurement that chose it.
* Depthwise: 16 channels x 8 pixels with the taps unrolled. A convolution reads its zero padding
  inline where its input is in memory anyway, the bounds test `likely` so that Halide's loop
  partitioning leaves it on the border tiles only (an unmarked test in every tap made depthwise
  3.4-5x slower; a zero-padded copy cost 10% of a 14x14 inverted residual).
* Parallelism in coarse tasks over rows; rows times groups of channel tiles for a convolution on
  a map of few rows, channel tiles (times heads) for a matrix product; no parallel loop at all for
  a stage too small to repay handing tasks to the pool (CpuParams.parallel_work). The threads are
  the delegate's pool's (delegate/src/thread_pool.cc), their count set at run time (the delegate's
  num_threads, else TFLite's).
* Everything else is vectorized along TFLite's innermost axis.

Weights arrive packed (halide_gen.pack) with the channel axis padded to pack.CHANNEL_TILE, so a tile
that runs past the last channel reads zeros that exist instead of guarding every vector.
"""

from __future__ import annotations

import collections
import math

from dataclasses import dataclass

import halide as hl
import numpy as np

from fusion.mapping import MtM, op_mapping

from ..block import Accumulator, BlockKernel
from ..lower import AccumulatorKind
from ..lower.elementwise import ELEMENTWISE
from ..pack import CHANNEL_TILE, padded
from ..values import Value


@dataclass(frozen=True)
class CpuParams:
    """Register-tile shape per target family (float32 lanes, channels x pixels per tile)."""

    lanes: int
    conv_channels: int
    conv_pixels: int
    dw_channels: int
    dw_pixels: int
    mm_channels: int  # fully-connected / batch-matmul: output columns per tile
    mm_rows: int
    # Smallest float32 intermediates (bytes, summed over a conv chain) worth streaming through row
    # buffers: below that, strips only add halo recomputation (MobileNetV2's 14x14 and 7x7 blocks:
    # 5-20% slower streamed). Tests set 0 to stream small chains.
    stream_bytes: int = 1 << 20
    # Fewest output rows per streamed strip (a few coarse tasks, little halo: schedules.md, lesson
    # 4). Tests set 2 so that small maps are cut into several strips too.
    strip_rows: int = 8
    # Pixels of a convolution's tile on rows that are a multiple of this many (0: conv_pixels
    # everywhere): twice the pixels per weight load where whole tiles of them fill the row.
    conv_row_pixels: int = 0
    # Vector registers a convolution's or matrix product's register tile may fill. Nonzero: the
    # tile shape is chosen per op by `modelled_tile` (fewest instructions for its channel count and
    # row width); 0: the fixed shapes above, as measured.
    registers: int = 0
    # Reduction steps per input load: at 4, a pointwise conv or matrix product loads 4 consecutive
    # input channels of a pixel in one vector and multiplies by each lane (NEON's `fmla` by element),
    # instead of one broadcast load per step.
    reduce_unroll: int = 1
    # Groups of `reduce_unroll` float steps per loop iteration, where they divide the reduction: at 2,
    # a matrix product's loop counter, branch and pointer increments come once per 8 steps, not 4.
    reduce_groups_unrolled: int = 1
    # Vectors per step of an elementwise stage's long innermost axis, where they divide it.
    elementwise_vectors: int = 1
    # (channels, pixels) of an int8 dot-product tile where it is fixed (0: as the float tiles).
    dot_tile: tuple[int, int] = (0, 0)
    # Dot-product groups per input load: at 4, a pixel's 16 consecutive input bytes come in one
    # vector and each `sdot` takes its 4-byte group by lane (NEON's dot product by element).
    dot_groups: int = 1
    # (channels, pixels) of an int8 depthwise tile whose taps are narrow products (0: as float):
    # its channels are one vector of int8 inputs, widened into the int32 sums.
    narrow_dw_tile: tuple[int, int] = (0, 0)
    # Work (elements times the terms each sums) below which a stage's loop stays serial: handing its
    # tasks to the threads costs more than such a stage takes. 1 << 16 while Halide's pool woke a
    # sleeping worker for every loop (MobileNetV3's squeeze-excite blocks: 4.9 us serial, 8.2 us with
    # two threads); the delegate's spinning pool hands tasks over in about a microsecond, and 1 << 14
    # also splits the zero-padded copies of 14x14 inverted residuals: mobilenet_v3_small at two
    # threads 1.09x -> 1.06x XNNPACK, mobilenet_v2 unchanged. See _parallel_worthwhile.
    parallel_work: int = 1 << 14
    # The same for the stages of a block with no convolution or matrix product (a LayerNorm, a
    # softmax): a few operations per element, several stages each handed to the threads. Split at
    # 1 << 14, gpt2_small's LayerNorm blocks ([64, 256]) took 13 us at two threads against 7 at one,
    # its softmax ([4, 64, 64]) 6 against 4; bert's [4, 128, 128] softmax is split (2^16 terms per stage).
    parallel_light_work: int = 1 << 16
    # Weight bytes of a float convolution above which its output-channel tiles go outside its rows
    # (0: never): about the core's L2 (Sapphire Rapids: 2 MB; a phone's big core: 256-512 KB, not
    # set for NEON, whose measure counts instructions and cannot see it).
    weight_cache_bytes: int = 0
    # Ways of the core's L1 data cache (0: not modelled) and the bytes one way spans: addresses that
    # many bytes apart share a set. A register tile whose pixels (a matrix product's rows) start
    # more than `l1_ways` to a set evicts its own inputs every few reduction steps: x86 cores index
    # 64 sets of 64-byte lines (Zen 4 and Skylake: 32 KB, 8 ways; Sapphire Rapids and Zen 5: 48 KB,
    # 12 ways), so rows of 1024 floats all share one. See _pixels_in_l1_sets.
    l1_ways: int = 0
    l1_way_bytes: int = 4096


# Measured on this host (AVX-512 EPYC), 1x1 conv 56x56x24->144+RELU6, one thread, XNNPACK 0.196 ms:
# 16x8 @8 lanes 0.256 ms, 32x4 @8 0.226, 48x2 @16 0.224, 32x4 @16 0.207 (ratio 1.06).
# Fully connected, 128 rows, same host (XNNPACK 0.61 ms for 256->1024, 0.15 ms for 256->256):
# 32 units x 4 rows 0.97 ms, 32x6 0.66, 32x8 0.61 (1.00x), 16x8 0.86; 256->256 ties at every shape.
# Int8 dot products (VPDPBUSD): each pixel's 4 input bytes are broadcast and shifted to uint8 (3
# instructions) for every 2 output vectors in a 32 x 4 tile; 64 x 6 (24 accumulators of 32 registers)
# shares them among 4.
# On a Zen 5 host (full-width AVX-512: two 512-bit FMAs a cycle) 8 accumulators could not hide the
# FMA latency: 32 x 7 conv tiles (14 accumulators; 7 divides the 112 / 56 / 28 / 14 / 7-pixel rows)
# took MobileNetV2's blocks cut out one by one from 1.25x to 1.06x XNNPACK (14x14 inverted residuals
# 1.5-1.6x -> 1.1x, the 7x7x1280 conv 1.43x -> 1.02x); 32 x 8 and the modelled tile were close,
# 64 x 7 and 16 x 14 slower. Fully connected 32 x 12 (24 accumulators): bert's 256 -> 1024 FC
# 1.10-1.30x -> 0.99x, gpt2's 1.07x -> 1.00x (bench/RESULTS-history.md, "Register tiles on full-width AVX-512").
# On a Sapphire Rapids Xeon (2 x 512-bit FMA, 2 loads a cycle) 32 x 14 tiles (28 accumulators: 16
# loads per 28 FMAs against 9 per 14) on MobileNet's 112 / 56 / 28 / 14-pixel rows took
# MobileNetV2's 14x14 inverted residuals from 1.05-1.19x XNNPACK to 0.95-1.02x (blocks cut out one
# by one); on 7-pixel rows 64 x 7 lost to 32 x 7, and rows that 14 does not divide (a U-Net's 64 /
# 32 / 16) keep their whole-row tiles of 8.
# Rows of 1024 floats 4 KB apart (bert's and GPT-2's FCs 1024 -> 256, ResNet's 1x1 convs over 1024
# channels) put all 12 rows of a 32 x 12 tile, or 14 pixels of a 32 x 14 one, in one 8-way L1 set:
# on a Zen 4 EPYC an FC 128 x 1024 -> 256 took 0.89 ms against 0.61 for 1000 inputs, a 14x14 1x1
# conv 1024 -> 256 1.78 ms against 0.91; tiles of 8 rows and 7 pixels: 0.63 and 1.01 (l1_ways).
X86 = CpuParams(lanes=16, conv_channels=32, conv_pixels=7, dw_channels=16, dw_pixels=8, mm_channels=32, mm_rows=12,
                dot_tile=(32, 7), conv_row_pixels=14, weight_cache_bytes=1 << 20, l1_ways=8)
# NEON: 4 lanes, 32 registers. Counted on qemu's cortex-a76 (bench/arm_count.py, MobileNetV2, ours /
# XNNPACK instructions, blocks cut out one by one): a fixed 4 vectors x 6 pixels tile with one
# broadcast load per reduction step 1.21; 4 steps per vector load with `fmla` by element 1.05 with a
# 4 x 5 tile (4 x 6 then spills: 24 accumulators + 6 inputs + 4 weights > 32); the modelled shape
# per op (modelled_tile: 2 x 7 on 7-pixel rows, 2 x 8 on 56, 8 x 1 for a GEMV) 1.05 -> 0.98 with
# NEON's NaN-propagating min / max (lower.ieee.native_minmax). Two groups of 4 steps per loop
# iteration: gpt2_small's FC loop 97 -> 189 instructions per 80 -> 160 `fmla`, MobileNetV2 0.923 ->
# 0.898, gpt2_small 0.935 -> 0.914 (four groups: 0.923 and 0.940, LLVM then holds more loads at once).
# Block outputs 4 vectors per loop step: efficientnet_b0 0.931 -> 0.922, mobilenet_v3_small 0.890 -> 0.880.
NEON = CpuParams(lanes=4, conv_channels=16, conv_pixels=6, dw_channels=8, dw_pixels=4, mm_channels=16, mm_rows=6,
                 registers=32, reduce_unroll=4, reduce_groups_unrolled=2, elementwise_vectors=4, dot_groups=4, narrow_dw_tile=(16, 4))


def _vars(f: hl.Func) -> list[hl.Var]:
    return [hl.Var(a.name()) for a in f.args()]


# Fewest output rows a convolution shares among threads one row per task: below that (a 7x7 or
# 1x1 map) its tasks are rows times groups of output-channel tiles, about this many in all, so
# that 8 threads have a task each. Measured at two threads (one block at a time): a 1x1 map's
# convolution (MobileNetV3's 576 -> 1024, which ran on one core) 0.025 -> 0.015 ms, MobileNetV2's
# 7x7x1280 one 0.104 -> 0.088. Not for depthwise convolutions, nor at 32 (14x14 and 28x28 maps cut
# by channels too): their blocks took up to 1.7x as long at two threads, as fast as ever at one.
ROW_TASKS = 8


def _row_axis(f: hl.Func, shape) -> hl.Var | None:
    """The outermost of `f`'s axes with more than one element, the innermost excluded: what the
    stages of a block split among threads. Every stage over the same rows takes the same axis, so
    the pool's per-thread shares give each thread the same rows in each (a LayerNorm on [1, 128,
    256] split none of its stages, which then read rows the other core's FC had written; a
    softmax's row sums ran on one thread after its exps ran on two)."""
    v = _vars(f)
    for k in range(len(v) - 1, 0, -1):  # Halide's order: v[0] is TFLite's innermost axis
        if shape[len(shape) - 1 - k] > 1:
            return v[k]
    return None


def _parallel_worthwhile(params: CpuParams, shape, depth: int = 1, light: bool = False) -> bool:
    """Whether a stage computing `shape`'s elements, each a sum of `depth` terms, has work enough
    to split across threads (CpuParams.parallel_work; parallel_light_work for a `light` block's
    stages)."""
    return int(np.prod(shape)) * depth >= (params.parallel_light_work if light else params.parallel_work)


def _split_rows(f: hl.Func, shape, params: CpuParams, depth: int = 1, light: bool = False) -> None:
    """Runs a stage computed at the root in parallel over its row axis (_row_axis), where it has
    work enough (_parallel_worthwhile)."""
    axis = _row_axis(f, shape)
    if axis is not None and _parallel_worthwhile(params, shape, depth, light):
        f.parallel(axis)


# Innermost axes this short (an RGB image's 3 channels) are unrolled inside vectors of pixels.
INTERLEAVED_CHANNELS = 4
# Innermost axes of up to this many channels, whole vectors, are unrolled: each vector's channels
# are then constants, so a CONCATENATION's select between its inputs (and their clamps) fold away
# (U-Net's 128x128 concatenation of 16 + 16 channels, copied zero-padded for a 3x3 conv: 306 us as
# a loop of selects, 25 us unrolled; the block went from 1.24x to 0.95x XNNPACK's time).
UNROLLED_CHANNELS = 64


def _lanes_of(f: hl.Func, lanes: int, extent: int, registers: int = 1) -> int:
    """Vector lanes for `f`'s element type: `lanes` float32s fill a register, so as many bytes of
    narrower types (16 int8 on NEON, where 4 lanes made an int8 copy 6 instructions per 4 bytes:
    MobileNetV2 int8's zero-padded depthwise inputs), times `registers` for narrow types, halved
    while a vector outgrows the axis. Narrower still (down to `lanes`) where that divides the axis
    and the wider one does not: a tail is a predicated vector stored a byte at a time (144 int8
    channels in 32-byte steps, 24 in 16-byte steps: an int8 ADD took 3x XNNPACK's instructions);
    one register where nothing divides it."""
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


def _vectorize_inner(f: hl.Func, shape, params: CpuParams, done: set[str], output: bool = False,
                     joins: tuple[int, ...] = ()) -> None:
    """Vectorizes `f` along TFLite's innermost axis when that axis holds at least one vector, else
    (a few channels, as a network's RGB input) along the pixels with the channels unrolled inside:
    Halide turns the channel-strided accesses into interleaved vector loads and stores (NEON's
    ld3 / st3) instead of a scalar loop (MobileNetV3's normalised 224x224x3 input: 10 scalar
    instructions per element). A block output's long axis goes up to `params.elementwise_vectors`
    vectors per step, as many as divide it (EfficientNet's squeeze-excite MUL over 144 channels
    took 9 instructions a vector in a loop of one: 2x XNNPACK's); intermediate stages keep one,
    as unrolled their sigmoids spilled (memory accesses +3 %). `done`: the names of the Funcs
    vectorized so far, skipped (a second split of the same axis is an error), `f`'s added.
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
    lanes = _lanes_of(f, params.lanes, shape[-1], registers=2)
    v = _vars(f)
    most = params.elementwise_vectors if output else 1
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
    elif short_lanes := _short_axis_lanes(shape[-1]):
        # Fewer channels than a register holds, more than are worth interleaving: narrower vectors
        # that divide them (8 float32 channels in AVX2 halves of AVX-512's 16 lanes; they had no
        # vectors at all: deeplab_like's RESIZE_BILINEAR to 64x64x8 ran scalar, 7.9x XNNPACK's time).
        f.vectorize(v[0], short_lanes)
    elif len(v) >= 2 and shape[-1] <= INTERLEAVED_CHANNELS and shape[-2] >= lanes:
        # Split, not bound: a consumer whose channel tile rounds up reads past the last channel.
        co, ci = hl.Var(v[0].name() + "_o"), hl.Var(v[0].name() + "_i")
        f.split(v[0], co, ci, shape[-1], hl.TailStrategy.GuardWithIf).reorder(ci, v[1], co).unroll(ci)
        f.vectorize(v[1], lanes, hl.TailStrategy.GuardWithIf)


def _short_axis_lanes(extent: int) -> int:
    """Lanes for an innermost axis too short for a whole register: the widest power of two of at
    least INTERLEAVED_CHANNELS + 1 that divides `extent`, else 0 (none does: 6, 7 or 9 channels,
    left to the interleaved or scalar forms)."""
    width = 1 << (extent.bit_length() - 1)
    while width > INTERLEAVED_CHANNELS and extent % width:
        width //= 2
    return width if width > INTERLEAVED_CHANNELS else 0


def _vector_steps(f: hl.Func, axis: hl.Var, extent: int, lanes: int, most: int) -> None:
    """Vectorizes `axis` (`extent` long) with up to `most` vectors per loop step, as many as divide it."""
    step = max(k for k in range(1, most + 1) if k == 1 or extent % (k * lanes) == 0)
    if step == 1:
        f.vectorize(axis, lanes, hl.TailStrategy.GuardWithIf)
    else:
        co, ci = hl.Var(axis.name() + "_steps"), hl.Var(axis.name() + "_step")
        f.split(axis, co, ci, step * lanes, hl.TailStrategy.GuardWithIf).vectorize(ci, lanes).unroll(ci)


def _home(kernel: BlockKernel, acc: Accumulator) -> hl.Func:
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


def _weights_outgrow_cache(acc: Accumulator, params: CpuParams) -> bool:
    """Whether a float convolution's weights exceed CpuParams.weight_cache_bytes: then a slice of
    them per output-channel tile, not the rows of the map, is what should stay in cache."""
    if acc.kind != AccumulatorKind.CONV or not params.weight_cache_bytes or not acc.acc.type().is_float():
        return False
    return 4 * int(np.prod(acc.extents)) * acc.value.shape[-1] > params.weight_cache_bytes


def _register_tile(home: hl.Func, acc: Accumulator, params: CpuParams, channels: int, pixels: int,
                   rdom_order: list[int] | None, unroll_taps: bool, round_up_channels: bool,
                   parallel: bool = True, whole_map: bool = False,
                   rows_outer: bool = False) -> tuple[hl.Var, int] | None:
    """Tiles `home` into channels x pixels register tiles and computes the accumulator at each,
    its reduction loops (in `rdom_order`, innermost first) outside the tile. `whole_map`: the
    template owns the loops (not a conv chain's strips), so a tiny map's rows may be one tile
    (_whole_map_rows) and the channel tiles may go outside the rows (_weights_outgrow_cache).
    `rows_outer` (a matrix product): the channel tiles go inside the row tiles instead, and the
    row-tile loop and the rows of a tile are returned, for stages computed once per row tile
    (_schedule_attention)."""
    lanes = params.lanes
    v = _vars(home)
    c = v[0]
    co, ci = hl.Var(c.name() + "_o"), hl.Var(c.name() + "_i")
    guard = hl.TailStrategy.GuardWithIf
    parallel = parallel and _parallel_worthwhile(params, acc.value.shape, int(np.prod(acc.extents)))
    row_loop = None
    if len(v) == 1:
        # A rank-1 result (a matrix-vector product): its tiles of output channels are the only
        # work to share.
        _align_to_packing(home, acc, c, channels, round_up_channels)
        home.split(c, co, ci, channels, guard).vectorize(ci, lanes)
        if parallel:
            home.parallel(co)
        acc.acc.compute_at(home, co).vectorize(_vars(acc.acc)[0], lanes, hl.TailStrategy.RoundUp)
        return
    x = v[1]
    rvars = [acc.rdom[k] for k in range(acc.rdom.dimensions())]
    order = rvars if rdom_order is None else [rvars[k] for k in rdom_order]
    innermost = 0 if rdom_order is None else rdom_order[0]
    steps, groups = _reduction_steps(acc, params, innermost, unroll_taps)
    if acc.dot and params.dot_tile[0]:
        channels, pixels = params.dot_tile
    # A dot-product group is one instruction per accumulator vector: one step of the tile model,
    # whose input loads then serve `groups` steps (as a float vector load serves 4 fmla by element).
    channels, pixels = _tile_shape(acc, params, channels, pixels, round_up_channels, groups if acc.dot else steps,
                                   modelled=not unroll_taps)
    rows = _whole_map_rows(acc, params, len(v)) if whole_map else 0
    if rows:
        channels, pixels = _whole_map_channels(acc, params, channels, round_up_channels, rows), acc.value.shape[-2]
    few = _few_channels(acc, home, len(v))
    if few:
        channels, pixels = few, min(lanes, acc.value.shape[-2])  # a vector of pixels, or the whole row
    _align_to_packing(home, acc, c, channels, round_up_channels)
    xo, xi = hl.Var(x.name() + "_o"), hl.Var(x.name() + "_i")
    home.tile(c, x, co, xo, ci, xi, channels, pixels, guard)
    if few:
        # Vectors of pixels, the few channels unrolled: the tile's epilogue (a sigmoid) runs on
        # whole vectors, not on 2 of 16 lanes.
        home.reorder(xi, ci).vectorize(xi).unroll(ci)
    else:
        # unroll(ci) unrolls the vectors left after vectorize. An int8 output takes a tile's worth of
        # channels at once, so its int32 epilogue narrows whole registers (4 int32 vectors -> 16 bytes).
        home.vectorize(ci, _lanes_of(home, lanes, channels)).unroll(ci).unroll(xi)
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
    elif whole_map and len(v) > 2 and _weights_outgrow_cache(acc, params):
        # Each channel tile's slice of the weights stays in cache while every row passes; with the
        # rows outside, all the weights came from beyond the cache once per row (Xception's 728 ->
        # 728 1x1 convs, 2.1 MB of weights, on 5x5 maps: 1.49x -> 1.03x XNNPACK).
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
        # the weights stays in cache while every row passes (schedules.md, FC 128x256->1024:
        # "output tiles outermost"); the tasks are channel tiles times the next axis (a batch
        # matmul's heads, a small map's rows), never one parallel loop per head.
        home.reorder([hl.VarOrRVar(w) for w in (ci, xi, xo, co, *v[2:])])
        inner_tile = xo
        if parallel and len(v) > 2:
            _parallel_with_channel_groups(home, co, v[2], -(-acc.value.shape[-1] // channels), acc.value.shape[-3])
        elif parallel:
            home.parallel(co)
    else:
        inner_tile = co
        if parallel:
            home.parallel(v[2] if len(v) > 2 else xo)

    f = acc.acc
    av = _vars(f)
    f.compute_at(home, inner_tile)  # the innermost of the two tile loops
    # A fixed-size tile gives the accumulator constant strides, so LLVM keeps it in registers
    # (a tail tile's smaller realized extent made the stride a runtime value: 3x slower).
    f.bound_storage(av[0], channels).bound_storage(av[1], pixels)
    channel_tail = hl.TailStrategy.RoundUp if round_up_channels else guard
    # Narrow terms: the whole tile's channels in one vector, so each tap loads a register of int8
    # inputs (16 bytes on NEON) instead of 4 bytes per int32 vector.
    acc_lanes = channels if acc.narrow or few else lanes
    f.vectorize(av[0], acc_lanes, channel_tail).unroll(av[0]).unroll(av[1])
    update = f.update()
    tile_loops = [hl.VarOrRVar(av[0]), hl.VarOrRVar(av[1])]
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
        load_at = _unroll_float_groups(update, acc, params, outer, innermost)
        if _group_wrapper(acc, steps, groups):
            group = acc.source.in_(f)
            group.compute_at(f, load_at).vectorize(_vars(group)[0], steps * groups)
            for var in _vars(group)[1:]:
                group.unroll(var)
    if unroll_taps:
        for r in order:
            update.unroll(r)
    return (row_loop, pixels) if row_loop is not None else None


# Maps of at most this many pixels (over more than one row) are tiled in bands of rows, as many as
# keep a tile's accumulators to the templates' budget (x86). MobileNetV1 on a 64x64 input ends in 2x2
# maps: its 1024 -> 1024 1x1 conv, tiled one row at a time, read its 4 MB of weights once per row:
# 1.95x XNNPACK's time (bench/block_table.py). On 4x4 maps a row is 4 pixels: 32-channel tiles of one
# row (8 accumulators) loaded two weight vectors per 8 multiply-adds and streamed the weights from
# L2 once per row; bands of two rows (16 accumulators) halve both.
WHOLE_MAP_PIXELS = 16


def _whole_map_rows(acc: Accumulator, params: CpuParams, rank: int) -> int:
    """The rows of a float convolution's small map that one register tile covers (a band of them
    that divides the map, the whole map where its channel tile fits), or 0 where tiles take one
    row at a time (x86 templates)."""
    if params.registers or acc.kind != AccumulatorKind.CONV or acc.dot or acc.narrow or rank != 4:
        return 0
    height, width = acc.value.shape[-3], acc.value.shape[-2]
    if height <= 1 or height * width > WHOLE_MAP_PIXELS:
        return 0
    budget = _accumulator_budget(params)
    row = width * params.conv_channels // params.lanes  # accumulators of one row at a full channel tile
    bands = [r for r in range(2, height + 1) if height % r == 0 and r * row <= budget]
    return max(bands) if bands else height


def _accumulator_budget(params: CpuParams) -> int:
    """Accumulator vectors a float convolution's register tile may hold (conv_channels x
    conv_row_pixels: 28 of AVX-512's 32 registers)."""
    return params.conv_channels * params.conv_row_pixels // params.lanes


def _whole_map_channels(acc: Accumulator, params: CpuParams, channels: int, round_up: bool, rows: int) -> int:
    """A band's channels: as many vectors as keep its accumulators (`rows` rows) to the templates'
    budget, halved from `channels` down to one vector."""
    pixels = rows * acc.value.shape[-2]
    while channels > params.lanes and (channels // params.lanes) * pixels > _accumulator_budget(params):
        channels //= 2
    return channels


def _unroll_float_groups(update: hl.Stage, acc: Accumulator, params: CpuParams, outer: hl.RVar,
                         innermost: int) -> hl.RVar:
    """Unrolls `params.reduce_groups_unrolled` iterations of a float tile's loop over groups of
    reduction steps (`outer`) where they divide it and it is the only reduction axis with more
    than one step (a matrix product, a pointwise conv); returns the loop each group's input loads
    belong in (the unrolled one, or `outer` unchanged). Inside a 3x3 conv's taps LLVM loaded both
    groups' inputs at once and spilled the tile: unet_small's memory accesses rose from 0.81 to
    0.91 of XNNPACK's for 0.6 % fewer instructions."""
    unrolled = params.reduce_groups_unrolled
    groups = acc.extents[innermost] // params.reduce_unroll
    taps = any(e > 1 for k, e in enumerate(acc.extents) if k != innermost)
    if acc.dot or unrolled < 2 or groups % unrolled or taps:
        return outer
    pairs, within = hl.RVar(outer.name() + "_p"), hl.RVar(outer.name() + "_u")
    update.split(outer, pairs, within, unrolled).unroll(within)
    return within


def _reduction_steps(acc: Accumulator, params: CpuParams, innermost: int, unroll_taps: bool) -> tuple[int, int]:
    """(steps, groups) of a register tile's innermost reduction axis: `steps` consecutive values a
    step takes in one vector (CpuParams.reduce_unroll, or a dot product's depth), and `groups` of
    those per input load (CpuParams.dot_groups, as many as divide the reduction: 24 input channels
    make 2 loads of 8 bytes)."""
    grouped = params.reduce_unroll > 1 and not unroll_taps and acc.extents[innermost] % params.reduce_unroll == 0
    steps = acc.dot or (params.reduce_unroll if grouped else 1)
    groups = params.dot_groups if acc.dot and acc.source is not None else 1
    while groups > 1 and acc.extents[innermost] % (steps * groups):
        groups //= 2
    return steps, groups


def _group_wrapper(acc: Accumulator, steps: int, groups: int) -> bool:
    """Whether a register tile with these (steps, groups) reads its source through a wrapper
    computed per group of reduction steps (`acc.source.in_()`): float steps by lane, or several
    dot-product groups per load; a lone dot-product group reads its source directly."""
    return steps > 1 and acc.source is not None and (groups > 1 or not acc.dot)


def _reads_in_groups(acc: Accumulator, params: CpuParams) -> bool:
    """Whether a convolution's register tile (reduction ordered ky, kx, ci: ci innermost) reads its
    input through a per-group wrapper (_group_wrapper)."""
    if acc.kind != AccumulatorKind.CONV:
        return False
    return _group_wrapper(acc, *_reduction_steps(acc, params, acc.rdom.dimensions() - 1, unroll_taps=False))


def _padding_inlined(kernel: BlockKernel, params: CpuParams) -> set[int]:
    """id() of the zero-padded inputs the convolutions read inline (BlockKernel.padding_read_in_place),
    except where
    - a tile reads its input in groups: the wrapper computed per group would keep the bounds test
      in the innermost loop, out of loop partitioning's reach (NEON's 4-step float tiles and SDOT
      groups: a U-Net's 3x3 convolutions took 2 % more instructions, an int8 stem 16 %);
    - a depthwise tile's channels run past the last one of an input that cannot be read there (a
      block input with MobileNetV3's 72, 88 or 120 channels, in 16-channel tiles): the channel
      clamp that keeps those reads inside the input turns every tap's vector load into a gather
      (2-5x slower); a copy clamps once per element. A convolution's result in the block can be
      read past its last channel (Value.readable_channels): no clamp, no copy (MobileNetV3's
      56x56x72 expand -> stride-2 depthwise -> project block: 0.193 -> 0.107 ms, XNNPACK 0.096);
    - the filter's window is wider or taller than the map it slides over (a 6x6 int8 depthwise on a
      1x3 map), or an int8 depthwise filter that sums its taps in pairs has an even side (4x4,
      6x6): Halide's bounds inference then asked the input for a column before its first (from a
      select whose condition it had used to drop the clamp), and the kernel could only fail its
      bounds check. Odd filters, the ones models use, keep their padding inline."""
    copied = set()
    for acc in kernel.accumulators:
        helpers = kernel.op_helpers[acc.op_index]
        channels = acc.value.shape[-1]
        tile = _depthwise_tile(acc, params)[0]
        ragged = (acc.kind == AccumulatorKind.DEPTHWISE and channels % tile
                  and any(h.readable_channels < -(-channels // tile) * tile for h in helpers))
        op = kernel.ops[acc.op_index]
        if ragged or _reads_in_groups(acc, params) or _window_outgrows_map(op) or (acc.narrow and _even_filter(op)):
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


CACHE_LINE = 64  # bytes


def _pixels_in_l1_sets(params: CpuParams, stride: int, pixels: int) -> bool:
    """Whether a register tile's `pixels` pixels (a matrix product's rows), whose source reads lie
    `stride` bytes apart, put at most CpuParams.l1_ways lines in any one L1 set: each reduction
    step reads one line per pixel, and more to a set than it has ways evict one another before
    the next step reads the rest of them (the source taken as line-aligned, as buffers are)."""
    if not params.l1_ways or not stride:
        return True
    sets = collections.Counter(p * stride % params.l1_way_bytes // CACHE_LINE for p in range(pixels))
    return max(sets.values()) <= params.l1_ways


def _tile_shape(acc: Accumulator, params: CpuParams, channels: int, pixels: int, round_up: bool,
                steps: int, modelled: bool) -> tuple[int, int]:
    """The register tile (channels, pixels) of one accumulator: modelled where the CPU's
    parameters give a register count (reductions over input channels only: a depthwise tile's
    taps are not in the model), else the fixed shape fitted to the op, with no more of its
    pixels in one L1 set than the cache holds (_pixels_in_l1_sets)."""
    width = acc.value.shape[-2] if len(acc.value.shape) >= 2 else 1
    if params.registers and modelled:
        return modelled_tile(acc.value.shape[-1], width, params.lanes, params.registers, round_up, steps)
    channels, pixels = _fixed_tile_shape(acc, params, channels, pixels, round_up, width)
    # Fewer pixels, not more channels: a 32 x 8 FC tile ran as fast as 64 x 6 on Zen 4, and
    # keeps twice the channel tiles to share among threads.
    while pixels > 1 and not _pixels_in_l1_sets(params, acc.source_stride, pixels):
        pixels -= 1
    return channels, pixels


def _fixed_tile_shape(acc: Accumulator, params: CpuParams, channels: int, pixels: int, round_up: bool,
                      width: int) -> tuple[int, int]:
    """_tile_shape's fixed shape for an op whose output rows are `width` pixels wide."""
    # A row or pixel count smaller than the tile (a 1x1 squeeze-excite conv, a one-row GEMV) gets
    # a tile of its own size instead of mostly-guarded lanes.
    if round_up:  # a tile must divide the packed channel count (a multiple of pack.CHANNEL_TILE)
        while channels > CHANNEL_TILE and padded(acc.value.shape[-1]) % channels:
            channels //= 2
    rows_fit = (params.conv_row_pixels and width % params.conv_row_pixels == 0
                and _pixels_in_l1_sets(params, acc.source_stride, params.conv_row_pixels))
    if acc.kind == AccumulatorKind.CONV and not acc.dot and rows_fit:
        return channels, params.conv_row_pixels
    if (acc.kind == AccumulatorKind.CONV and not acc.dot and pixels < width <= params.conv_row_pixels
            and _pixels_in_l1_sets(params, acc.source_stride, width)):
        # A row no longer than the widest tile is one tile: Xception's 9-pixel rows were tiles of
        # 5 + 4 (10 and 8 accumulators, each loading the weights), its 9x9 1x1 convs 1.39x -> 1.05x.
        return channels, width
    requested = pixels
    if acc.kind == AccumulatorKind.CONV and width > pixels:
        pixels = _whole_rows(width, pixels)
    pixels = max(1, min(pixels, width))
    if pixels < requested:
        # Keep the accumulator count: fewer pixels, more channels (a one-row GEMV gets 8x the
        # channels). With rounded-up channels the tile must divide the packed channel count.
        channels = _widened(channels, channels * requested // pixels, acc.value.shape[-1], round_up)
    return channels, pixels


def _few_channels(acc: Accumulator, home: hl.Func, rank: int) -> int:
    """The channel count of a float convolution whose output has so few (<= INTERLEAVED_CHANNELS,
    rounded up to a power of two) that its register tile runs over vectors of pixels instead, when
    an elementwise epilogue is computed in the tile (its home is not the op's own result); else 0."""
    channels = acc.value.shape[-1]
    if acc.kind != AccumulatorKind.CONV or acc.dot or acc.narrow or rank < 3 or channels > INTERLEAVED_CHANNELS:
        return 0
    if home is acc.value.func:
        return 0
    return 1 << (channels - 1).bit_length()


def _whole_rows(width: int, pixels: int) -> int:
    """The pixel count near `pixels` (one more, down to three fewer, never under half) whose tiles
    waste the fewest columns of a `width`-pixel row, the nearest on a tie: 7 on MobileNet's 112 / 56
    / 28 / 14 / 7 rows, 8 on a U-Net's 64 / 32 / 16 / 8, where 7 left a one-pixel tail tile (its 8x8
    maps' 3x3 convolutions were 1.32-1.36x XNNPACK, now 0.97x; its 16x16 ones 1.14-1.28x -> 1.01x)."""
    candidates = range(pixels + 1, max(pixels - 3, pixels // 2 + 1) - 1, -1)
    return min(candidates, key=lambda p: (-(-width // p) * p - width, abs(p - pixels)))


def modelled_tile(channels: int, width: int, lanes: int, registers: int, round_up: bool,
                  steps: int) -> tuple[int, int]:
    """The register tile with the fewest instructions for an op with `channels` outputs per pixel
    and rows `width` pixels long, counting per group of `steps` reduction steps: one fused
    multiply-add per accumulator vector and step, one input load per pixel (a vector of `steps`
    values, or a broadcast when `steps` is 1), weight vectors loaded in pairs, and 3 for the loop.
    Accumulators, one input per pixel and one step's weights must fit in `registers` (one spare):
    past that the tile spills (4 x 6 on NEON with 4-step loads did). Tiles that run past the last
    channel or pixel count in full: their lanes are wasted work."""
    best: tuple[float, int, int] | None = None
    limit = padded(channels) if round_up else channels
    for vectors in (2, 4, 8):
        size = vectors * lanes
        if size > max(limit, 2 * lanes) or (round_up and limit % size):
            continue
        for px in range(1, min(width, 12) + 1):
            if vectors * px + px + vectors > registers - 1:
                break

            def cost(p: int) -> int:
                return vectors * p * steps + p + -(-vectors * steps // 2) + 3

            full, tail = divmod(width, px)
            total = -(-channels // size) * (full * cost(px) + (cost(tail) if tail else 0))
            if best is None or total < best[0]:
                best = (total, size, px)
    assert best is not None
    return best[1], best[2]


def _materialize_prologue(kernel: BlockKernel, acc: Accumulator, params: CpuParams, vectorized: set[str]) -> None:
    """Computes the in-block producers of a reduction's inputs once, at the root (`vectorized`:
    as _vectorize_inner takes it).

    Inlined, an elementwise producer (GELU before a fully-connected layer) would be recomputed for
    every output channel, and a TRANSPOSE before a matrix product would turn its dense loads into
    strided ones (bert: 8x and 6x slower than XNNPACK before this).
    """
    op = kernel.ops[acc.op_index]
    if kernel.op_helpers[acc.op_index]:
        return  # the op reads its input through a helper it materialises (a zero-padded copy)
    for t in op.inputs:
        v = kernel.values.get(id(t)) if t is not None else None
        if v is None or id(v.func) not in kernel.read_in_block or any(v.func is a.value.func for a in kernel.accumulators):
            continue
        producer = next((o for o in kernel.ops[: acc.op_index] if any(u is t for u in o.outputs)), None)
        if producer is None or op_mapping(producer) == MtM:
            continue
        v.func.compute_root()
        fv = _vars(v.func)
        if not _tile_transpose(v, params.lanes, vectorized):
            _vectorize_inner(v.func, v.shape, params, vectorized, output=True, joins=v.joins)
        if len(fv) > 1 and _parallel_worthwhile(params, v.shape):
            v.func.parallel(fv[-1] if v.shape[0] > 1 or len(fv) < 3 else fv[-2])


def _tile_transpose(value: Value, lanes: int, done: set[str]) -> bool:
    """Schedules a materialised TRANSPOSE that moves the innermost axis in square tiles of `lanes`:
    each output vector then comes from `lanes` unrolled reads along the input's own innermost axis,
    which LLVM turns into vector loads and shuffles, instead of one gather of `lanes` elements
    (bert's K^T, 128 x 64 per head: 28 us as gathers, 6 us in tiles: half its QK^T block). False
    (nothing scheduled) for any other op, a transpose that keeps the innermost axis, or one
    scheduled already (`done`, as _vectorize_inner takes it: a second split of an axis is an error,
    and two reductions of a block may read one transpose)."""
    if not value.perm or value.func.name() in done:
        return False
    f, shape, rank = value.func, value.shape, value.rank
    source_axis = value.perm.index(rank - 1)  # the output axis that walks the input's innermost one
    if source_axis == rank - 1 or shape[-1] < lanes or shape[source_axis] < lanes:
        return False
    done.add(f.name())
    v = _vars(f)
    c, x = v[0], v[rank - 1 - source_axis]
    co, xo, ci, xi = (hl.Var(f"{name}_t") for name in ("co", "xo", "ci", "xi"))
    f.tile(c, x, co, xo, ci, xi, lanes, lanes, hl.TailStrategy.GuardWithIf).vectorize(ci).unroll(xi)
    return True


def _widened(base: int, want: int, extent: int, must_divide_padding: bool) -> int:
    """The widest channel tile <= `want` (a multiple of `base`) that suits `extent` channels."""
    limit = padded(extent)
    best = base
    for size in range(base, want + 1, base):
        if size > limit:
            break
        if not must_divide_padding or limit % size == 0:
            best = size
    return best


def _depthwise_tile(acc: Accumulator, params: CpuParams) -> tuple[int, int]:
    """(channels, pixels) of a depthwise register tile."""
    if acc.narrow and params.narrow_dw_tile[0]:
        return params.narrow_dw_tile
    return params.dw_channels, params.dw_pixels


def _tile_depthwise(acc: Accumulator, home: hl.Func, params: CpuParams, parallel: bool = True,
                    whole_map: bool = True) -> None:
    """Channels x pixels, the taps unrolled (one row at a time, whatever `whole_map` says)."""
    channels, pixels = _depthwise_tile(acc, params)
    _register_tile(home, acc, params, channels, pixels, None, unroll_taps=True,
                   round_up_channels=True, parallel=parallel)


def _tile_conv(acc: Accumulator, home: hl.Func, params: CpuParams, parallel: bool = True,
               whole_map: bool = True) -> None:
    """Channels x pixels; RDom (ky, kx, ci) loops ci innermost, then kx, then ky (a filter row's
    taps, (ky, row), for a narrow-input dot-product conv). `whole_map`: a tiny map in one tile
    (not where a conv chain computes the map a row at a time)."""
    innermost_first = list(reversed(range(acc.rdom.dimensions())))
    _register_tile(home, acc, params, params.conv_channels, params.conv_pixels, innermost_first,
                   unroll_taps=False, round_up_channels=True, parallel=parallel, whole_map=whole_map)


def _tile_for(acc: Accumulator, home: hl.Func, params: CpuParams, parallel: bool = True,
              whole_map: bool = True) -> None:
    """A convolution's register tile, by its kind."""
    CONV_TILES[acc.kind](acc, home, params, parallel, whole_map)


# The register tile of each convolution kind (a conv chain streams only these).
CONV_TILES = {AccumulatorKind.CONV: _tile_conv, AccumulatorKind.DEPTHWISE: _tile_depthwise}


def _template_reduce(kernel: BlockKernel, acc: Accumulator, params: CpuParams, tiled: set[int]) -> None:
    """A sum over outer axes: vectorized along the untouched innermost axis."""
    _schedule_outer_reduction(acc, params.lanes)


def _template_conv(kernel: BlockKernel, acc: Accumulator, params: CpuParams, tiled: set[int]) -> None:
    """A convolution in a register tile of its consumer (the op's output)."""
    home = _home(kernel, acc)
    tiled.add(id(home))
    _tile_for(acc, home, params)


def _template_matmul(kernel: BlockKernel, acc: Accumulator, params: CpuParams, tiled: set[int]) -> None:
    """A matrix product in a register tile of rows x output channels."""
    home = _home(kernel, acc)
    tiled.add(id(home))
    packed = any(a.pack for a in kernel.arguments if a.tensor in kernel.ops[acc.op_index].inputs)
    _register_tile(home, acc, params, params.mm_channels, params.mm_rows, None, unroll_taps=False,
                   round_up_channels=packed)


# The template that schedules each kind of accumulator (halide_gen.lower.AccumulatorKind).
TEMPLATES = {AccumulatorKind.CONV: _template_conv, AccumulatorKind.DEPTHWISE: _template_conv,
             AccumulatorKind.MATMUL: _template_matmul, AccumulatorKind.REDUCE: _template_reduce}


def _conv_chain(kernel: BlockKernel, stream_bytes: int = X86.stream_bytes) -> list[Accumulator] | None:
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
    # Streaming pays when the intermediates would not stay in cache (CpuParams.stream_bytes).
    intermediate = sum(4 * int(np.prod(a.value.shape)) for a in accs[:-1])
    return accs if intermediate >= stream_bytes else None


def _schedule_conv_chain(kernel: BlockKernel, chain: list[Accumulator], params: CpuParams,
                         in_place: set[int], vectorized: set[str]) -> set[int]:
    """Streams a conv chain through row buffers: the output is cut into strips of rows (one
    parallel task each); within a strip, every earlier convolution (and the zero-padded copy
    the next one reads) is computed one row at a time into a sliding buffer that holds just the
    rows still needed (schedules.md: "expand rows into a 4-row ring buffer; depthwise per 8-pixel
    tile"). A strip recomputes its halo rows, so tasks stay independent. Padding in `in_place`
    (_padding_inlined) is read inline from the rows of the convolution before, not copied.

    Returns the ids of the Funcs it scheduled.
    """
    last = chain[-1]
    home = kernel.outputs[0][1].func  # the last conv and its epilogue inline into the output
    _tile_for(last, home, params, parallel=False, whole_map=False)  # rows are split into strips below
    y = _vars(home)[2]
    yo, yi = hl.Var("y_strip"), hl.Var("y_row")
    rows = last.value.shape[1]
    strip = max(params.strip_rows, -(-rows // 4))
    home.split(y, yo, yi, strip, hl.TailStrategy.GuardWithIf).parallel(yo)
    done = {id(home)}
    for acc in chain[:-1]:
        f = acc.value.func
        f.store_at(home, yo).compute_at(home, yi)
        _tile_for(acc, f, params, parallel=False, whole_map=False)
        done.add(id(f))
    for acc in chain[1:]:
        for helper in kernel.op_helpers[acc.op_index]:
            if id(helper.func) in in_place:
                continue  # the taps read the rows of the convolution before (_padding_inlined)
            g = helper.func
            g.store_at(home, yo).compute_at(home, yi)
            _vectorize_inner(g, helper.shape, params, vectorized, joins=helper.joins)
            done.add(id(g))
    return done


def _schedule_outer_reduction(acc: Accumulator, lanes: int) -> None:
    """Sums over outer axes (global average pooling): the accumulator at the root, vectorized along
    the kept innermost axis, in chunks of up to 8 vectors that stay in registers while the
    reduction loops run inside the chunk (a load and an add per vector; with the reduction
    outermost, the accumulator went through memory: 8 instructions per vector, MobileNetV2's
    MEAN 2.9x XNNPACK's on NEON)."""
    f = acc.acc
    f.compute_root()
    fv = _vars(f)
    rvars = [acc.rdom[k] for k in reversed(range(acc.rdom.dimensions()))]  # innermost reduced axis first
    channels = acc.value.shape[-1] if acc.value.shape else 1
    update = f.update()
    if channels < lanes:
        update.reorder([hl.VarOrRVar(fv[0])] + [hl.VarOrRVar(r) for r in rvars] + [hl.VarOrRVar(v) for v in fv[1:]])
        return
    f.vectorize(fv[0], lanes, hl.TailStrategy.GuardWithIf)
    chunk = min(8 * lanes, -(-channels // lanes) * lanes)
    outer, inner = hl.Var(fv[0].name() + "_o"), hl.Var(fv[0].name() + "_i")
    update.split(fv[0], outer, inner, chunk, hl.TailStrategy.GuardWithIf)
    update.reorder([hl.VarOrRVar(inner)] + [hl.VarOrRVar(r) for r in rvars]
                   + [hl.VarOrRVar(outer)] + [hl.VarOrRVar(v) for v in fv[1:]])
    update.vectorize(inner, lanes).unroll(inner)


# Score matrices ([heads, queries, keys] float32) of at most this many bytes are computed whole, a
# stage at a time, in an attention core's kernel; larger ones a tile of query rows at a time
# (_schedule_attention). Measured on the x86 host, one thread, the core cut out: 4 heads x 512 x
# 512 x 64 (4 MB of scores) 6.5 ms a stage at a time, 3.6 ms in row tiles; bert_small's 4 x 128 x
# 128 (256 KB, in L2 either way) 178 us a stage at a time, 188-235 us in tiles of 8-12 rows (each
# tile reads all the keys and values again; XNNPACK 197 us, three kernels of ours apart 193 us).
ATTENTION_TILED_BYTES = 1 << 20


def _attention_core(kernel: BlockKernel) -> tuple[Accumulator, Accumulator, list[Value]] | None:
    """(scores, weights x values, the stages per row tile) of a block that is an attention core
    (fusion.table3.attention_allowed) whose scores outgrow ATTENTION_TILED_BYTES: two float matrix
    products, the second reading the softmax of the first's result (through elementwise ops) as
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
    if 4 * int(np.prod(scores.value.shape)) <= ATTENTION_TILED_BYTES:
        return None
    stages = _attention_stages(kernel, scores, s)
    if any(kernel.is_output(v.func) for v in stages):
        return None
    return scores, weights, stages


def _attention_stages(kernel: BlockKernel, scores: Accumulator, softmax: int) -> list[Value]:
    """The Funcs an attention core computes per row tile of its second product: the scores, the
    softmax's helpers (row maxima, exponentials, sums: their partials too) and the softmax itself.
    The elementwise ops between (scale, mask) stay inlined into them."""
    helpers = [h for k in range(scores.op_index, softmax + 1) for h in kernel.op_helpers[k]]
    return [scores.value, *helpers, kernel.op_values[softmax][0]]


def _schedule_attention(kernel: BlockKernel, core: tuple[Accumulator, Accumulator, list[Value]],
                        params: CpuParams, vectorized: set[str]) -> set[int]:
    """The attention core in one pass over tiles of query rows: the second product (weights x
    values) tiled rows outside channels, and at each row tile the scores of those rows (their own
    register tiles), the softmax's statistics and the weights computed once, serially, in a few KB
    (rows x keys) that stay in L1: the [heads, queries, keys] matrix is never stored whole. Returns
    id() of the Funcs it scheduled."""
    scores, weights, stages = core
    for acc in (scores, weights):
        _materialize_prologue(kernel, acc, params, vectorized)  # transposed queries, keys, values
    home = _home(kernel, weights)
    row_loop, rows = _register_tile(home, weights, params, params.mm_channels, params.mm_rows, None,
                                    unroll_taps=False, round_up_channels=False, rows_outer=True)
    _register_tile(scores.value.func, scores, params, params.mm_channels, params.mm_rows, None,
                   unroll_taps=False, round_up_channels=False, parallel=False)
    terms = {id(r.partial.func) for r in kernel.row_reductions}
    for v in stages:
        # A constant size (the last row tile is shorter): on the stack, not a heap allocation per tile.
        v.func.compute_at(home, row_loop).bound_storage(_vars(v.func)[1], rows)
        if v is not scores.value:
            _vectorize_helper(v, params, vectorized, id(v.func) in terms)
    return {id(home), *(id(v.func) for v in stages)}


def _vectorize_helper(v: Value, params: CpuParams, vectorized: set[str], partial: bool, copy: bool = False) -> None:
    """Vectorizes a materialised helper along its innermost axis; a row reduction's partial results
    (`partial`) as one vector of them."""
    f = v.func
    if partial and f.name() not in vectorized:
        # A row reduction's partial results are one vector (4 NEON registers), so the inline
        # reduction behind them runs one loop with 4 accumulators, not 4 loops of one: bert's
        # LayerNorm and softmax blocks, ARM64 bert_small 0.913 -> 0.907, gpt2_small 0.904 -> 0.898.
        f.vectorize(_vars(f)[0], v.shape[-1])
        vectorized.add(f.name())
    else:
        _vectorize_inner(f, v.shape, params, vectorized, output=copy, joins=v.joins)


def schedule_cpu(kernel: BlockKernel, params: CpuParams = X86) -> None:
    """Applies the CPU templates in place; what no template covers is computed at the root
    (Many-to-Many results) or inlined, and vectorized along the innermost axis."""
    chain = _conv_chain(kernel, params.stream_bytes)
    in_place = _padding_inlined(kernel, params)
    vectorized: set[str] = set()  # (_vectorize_inner)
    streamed = _schedule_conv_chain(kernel, chain, params, in_place, vectorized) if chain else set()
    core = None if chain else _attention_core(kernel)
    if core:
        streamed = _schedule_attention(kernel, core, params, vectorized)
    terms = {id(r.partial.func): r.terms for r in kernel.row_reductions}
    light = not kernel.accumulators
    # Zero-padded copies move data only: several vectors a step, as block outputs take.
    copies = {id(p.func) for p, _ in kernel.padded}
    for v in kernel.materialize:
        if id(v.func) in streamed or id(v.func) in in_place:
            continue
        f = v.func
        f.compute_root()
        _vectorize_helper(v, params, vectorized, id(f) in terms, copy=id(f) in copies)
        _split_rows(f, v.shape, params, terms.get(id(f), 1), light)
    tiled = set(streamed)
    # A conv chain's or an attention core's accumulators were scheduled with it, above.
    for acc in [] if chain or core else kernel.accumulators:
        _materialize_prologue(kernel, acc, params, vectorized)
        if acc.kind not in TEMPLATES:
            raise ValueError(f"no CPU schedule template for {acc.kind}")
        TEMPLATES[acc.kind](kernel, acc, params, tiled)
    # Many-to-Many results no template covers, and small results read broadcast (computed once, not
    # once per element of their consumer), are computed at the root.
    roots = [v for k, (op, values) in enumerate(zip(kernel.ops, kernel.op_values))
             if op_mapping(op) == MtM and not any(a.op_index == k for a in kernel.accumulators)
             for v in values if not kernel.inline_into_output(v.func) and id(v.func) not in streamed]
    roots += [v for v in kernel.broadcast_sources() if not kernel.is_output(v.func)]
    rooted = {id(v.func) for v in kernel.materialize} | {id(a.value.func) for a in kernel.accumulators} | tiled
    for v in roots:
        if id(v.func) not in rooted:
            v.func.compute_root()
            _vectorize_inner(v.func, v.shape, params, vectorized, joins=v.joins)
            rooted.add(id(v.func))
            # Split across threads like the helpers above (an attention core's softmax, read by
            # its second product: serial, bert_small's cores took 160 us at two threads, not 140).
            _split_rows(v.func, v.shape, params, light=light)
    for tensor, v in kernel.outputs:
        if id(v.func) in tiled or not tensor.shape:
            continue
        f = v.func
        # A transposed output (a decoder's K^T beside its cache) in square tiles, not gathers.
        if not _tile_transpose(v, params.lanes, vectorized):
            _vectorize_inner(f, tensor.shape, params, vectorized, output=True, joins=v.joins)
        _split_rows(f, tensor.shape, params, light=light)
