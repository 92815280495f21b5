"""The register-tile model: plain integer decisions about a convolution's or matrix product's
register tile (its channels and pixels, its reduction steps per load, whether it is worth threads),
from an accumulator's shapes and a CPU's parameters. Nothing here touches Halide; register_tile
applies what these decide."""

from __future__ import annotations

import collections

import numpy as np

from ..block import Accumulator
from ..lower import AccumulatorKind
from ..pack import CHANNEL_TILE, padded
from .params import CACHE_LINE, INTERLEAVED_CHANNELS, WHOLE_MAP_PIXELS, CpuParams


def parallel_worthwhile(params: CpuParams, shape, depth: int = 1, light: bool = False) -> bool:
    """Whether a stage computing `shape`'s elements, each a sum of `depth` terms, has work enough
    to split across threads (CpuParams.parallel_work; parallel_light_work for a `light` block's
    stages)."""
    return int(np.prod(shape)) * depth >= (params.parallel_light_work if light else params.parallel_work)


def weights_outgrow_cache(acc: Accumulator, params: CpuParams) -> bool:
    """Whether a float convolution's weights exceed CpuParams.weight_cache_bytes: then a slice of
    them per output-channel tile, not the rows of the map, is what should stay in cache."""
    if acc.kind != AccumulatorKind.CONV or not params.weight_cache_bytes or not acc.acc.type().is_float():
        return False
    return 4 * int(np.prod(acc.extents)) * acc.value.shape[-1] > params.weight_cache_bytes


def whole_map_rows(acc: Accumulator, params: CpuParams, rank: int) -> int:
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


def whole_map_channels(acc: Accumulator, params: CpuParams, channels: int, round_up: bool, rows: int) -> int:
    """A band's channels: as many vectors as keep its accumulators (`rows` rows) to the templates'
    budget, halved from `channels` down to one vector."""
    pixels = rows * acc.value.shape[-2]
    while channels > params.lanes and (channels // params.lanes) * pixels > _accumulator_budget(params):
        channels //= 2
    return channels


def reduction_steps(acc: Accumulator, params: CpuParams, innermost: int, unroll_taps: bool) -> tuple[int, int]:
    """(steps, groups) of a register tile's innermost reduction axis: `steps` consecutive values a
    step takes in one vector (CpuParams.reduce_unroll, or a dot product's depth), and `groups` of
    those per input load (CpuParams.dot_groups, as many as divide the reduction: 24 input channels
    make 2 loads of 8 bytes)."""
    steps = acc.dot or (1 if unroll_taps else float_steps(acc, innermost, params))
    groups = params.dot_groups if acc.dot and acc.source is not None else 1
    while groups > 1 and acc.extents[innermost] % (steps * groups):
        groups //= 2
    return steps, groups


def float_steps(acc: Accumulator, innermost: int, params: CpuParams) -> int:
    """Float reduction steps a vector load serves: CpuParams.reduce_unroll where it divides the
    reduction, else, in a matrix product, the largest halving of it that does, down to
    CpuParams.reduce_unroll_least; else 1 (a broadcast load a step). Not in a convolution: on
    EfficientNet-B0's squeeze-excite convs (one pixel, 6 or 10 deep, a sigmoid after) pairs saved
    no instructions and cost 2 % of the model's A76 cycles."""
    extent, steps = acc.extents[innermost], params.reduce_unroll
    least = max(params.reduce_unroll_least, 2) if acc.kind == AccumulatorKind.MATMUL else steps
    while steps > 1 and extent % steps:
        steps = steps // 2 if steps // 2 >= least else 1
    return steps


def group_wrapper(acc: Accumulator, steps: int, groups: int) -> bool:
    """Whether a register tile with these (steps, groups) reads its source through a wrapper
    computed per group of reduction steps (`acc.source.in_()`): float steps by lane, or several
    dot-product groups per load; a lone dot-product group reads its source directly."""
    return steps > 1 and acc.source is not None and (groups > 1 or not acc.dot)


def reads_in_groups(acc: Accumulator, params: CpuParams) -> bool:
    """Whether a convolution's register tile (reduction ordered ky, kx, ci: ci innermost) reads its
    input through a per-group wrapper (group_wrapper)."""
    if acc.kind != AccumulatorKind.CONV:
        return False
    return group_wrapper(acc, *reduction_steps(acc, params, acc.rdom.dimensions() - 1, unroll_taps=False))


def pixels_in_l1_sets(params: CpuParams, stride: int, pixels: int) -> bool:
    """Whether a register tile's `pixels` pixels (a matrix product's rows), whose source reads lie
    `stride` bytes apart, put at most CpuParams.l1_ways lines in any one L1 set: each reduction
    step reads one line per pixel, and more to a set than it has ways evict one another before
    the next step reads the rest of them (the source taken as line-aligned, as buffers are)."""
    if not params.l1_ways or not stride:
        return True
    sets = collections.Counter(p * stride % params.l1_way_bytes // CACHE_LINE for p in range(pixels))
    return max(sets.values()) <= params.l1_ways


# Fewest channels of a matrix product's dot-product tile. Its weights are blocked by pack.CHANNEL_TILE
# channels, each channel's 4 bytes beside the next's (pack "dot4_blocked"); a vector of 4 channels
# x 4 bytes from a tile that starts at 8 x t (t unknown mod 2) had each byte's address computed
# apart, a gather a load (bench/RESULTS.md, "ARM64: dynamic-range models"). From 16 x t, Halide
# folds the index into one dense load.
SMALLEST_BLOCKED_DOT_TILE = 16


def tile_shape(acc: Accumulator, params: CpuParams, channels: int, pixels: int, round_up: bool,
                steps: int, modelled: bool) -> tuple[int, int]:
    """The register tile (channels, pixels) of one accumulator: modelled where the CPU's
    parameters give a register count (reductions over input channels only: a depthwise tile's
    taps are not in the model), else the fixed shape fitted to the op, with no more of its
    pixels in one L1 set than the cache holds (pixels_in_l1_sets)."""
    width = acc.value.shape[-2] if len(acc.value.shape) >= 2 else 1
    if params.registers and modelled:
        least = SMALLEST_BLOCKED_DOT_TILE if acc.dot and acc.kind == AccumulatorKind.MATMUL else 0
        return modelled_tile(acc.value.shape[-1], width, params.lanes, params.registers, round_up, steps, least)
    channels, pixels = _fixed_tile_shape(acc, params, channels, pixels, round_up, width)
    # Fewer pixels, not more channels: a 32 x 8 FC tile ran as fast as 64 x 6 on Zen 4, and
    # keeps twice the channel tiles to share among threads.
    while pixels > 1 and not pixels_in_l1_sets(params, acc.source_stride, pixels):
        pixels -= 1
    return channels, pixels


def _fixed_tile_shape(acc: Accumulator, params: CpuParams, channels: int, pixels: int, round_up: bool,
                      width: int) -> tuple[int, int]:
    """tile_shape's fixed shape for an op whose output rows are `width` pixels wide."""
    # A row or pixel count smaller than the tile (a 1x1 squeeze-excite conv, a one-row GEMV) gets
    # a tile of its own size instead of mostly-guarded lanes.
    if round_up:  # a tile must divide the packed channel count (a multiple of pack.CHANNEL_TILE)
        while channels > CHANNEL_TILE and padded(acc.value.shape[-1]) % channels:
            channels //= 2
    rows_fit = (params.conv_row_pixels and width % params.conv_row_pixels == 0
                and pixels_in_l1_sets(params, acc.source_stride, params.conv_row_pixels))
    if acc.kind == AccumulatorKind.CONV and not acc.dot and rows_fit:
        return channels, params.conv_row_pixels
    if (acc.kind == AccumulatorKind.CONV and not acc.dot and pixels < width <= params.conv_row_pixels
            and pixels_in_l1_sets(params, acc.source_stride, width)):
        # A row no longer than the widest tile is one tile: two tiles of it (5 + 4 pixels) would
        # each load the weights for fewer accumulators.
        return channels, width
    requested = pixels
    if acc.kind == AccumulatorKind.CONV and width > pixels:
        pixels = whole_rows(width, pixels)
        if budget := _accumulator_budget(params):  # the pixel it may add must fit too: AVX2's 16 x 7 spilled
            pixels = min(pixels, max(requested, budget * params.lanes // channels))
    pixels = max(1, min(pixels, width))
    if pixels < requested:
        # Keep the accumulator count: fewer pixels, more channels (a one-row GEMV gets 8x the
        # channels). With rounded-up channels the tile must divide the packed channel count.
        channels = widened(channels, channels * requested // pixels, acc.value.shape[-1], round_up)
    return channels, pixels


def dividing_size(extent: int, most: int) -> int:
    """The largest size from `most` down to half of it that divides `extent` (no shorter last tile),
    else `most`."""
    return next((size for size in range(most, (most - 1) // 2, -1) if extent % size == 0), most)


def whole_rows(width: int, pixels: int) -> int:
    """The pixel count near `pixels` (one more, down to three fewer, never under half) whose tiles
    waste the fewest columns of a `width`-pixel row, the nearest on a tie: 7 on MobileNet's 112 / 56
    / 28 / 14 / 7 rows, 8 on a U-Net's 64 / 32 / 16 / 8, where 7 left a one-pixel tail tile that
    loads the weights for a single accumulator per vector."""
    candidates = range(pixels + 1, max(pixels - 3, pixels // 2 + 1) - 1, -1)
    return min(candidates, key=lambda p: (-(-width // p) * p - width, abs(p - pixels)))


def modelled_tile(channels: int, width: int, lanes: int, registers: int, round_up: bool,
                  steps: int, least: int = 0) -> tuple[int, int]:
    """The register tile with the fewest instructions for an op with `channels` outputs per pixel
    and rows `width` pixels long, counting per group of `steps` reduction steps: one fused
    multiply-add per accumulator vector and step, one input load per pixel (a vector of `steps`
    values, or a broadcast when `steps` is 1), weight vectors loaded in pairs, and 3 for the loop.
    Accumulators, one input per pixel and one step's weights must fit in `registers` (one spare):
    past that the tile spills (4 x 6 on NEON with 4-step loads did). Tiles that run past the last
    channel or pixel count in full: their lanes are wasted work. No tile has fewer than `least`
    channels."""
    best: tuple[float, int, int] | None = None
    limit = padded(channels) if round_up else channels
    for vectors in (2, 4, 8):
        size = vectors * lanes
        if size > max(limit, 2 * lanes, least) or (round_up and limit % size) or size < least:
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


def widened(base: int, want: int, extent: int, must_divide_padding: bool) -> int:
    """The widest channel tile <= `want` (a multiple of `base`) that suits `extent` channels."""
    limit = padded(extent)
    best = base
    for size in range(base, want + 1, base):
        if size > limit:
            break
        if not must_divide_padding or limit % size == 0:
            best = size
    return best


def depthwise_tile(acc: Accumulator, params: CpuParams) -> tuple[int, int]:
    """(channels, pixels) of a depthwise register tile."""
    if acc.narrow and params.narrow_dw_tile[0]:
        return params.narrow_dw_tile
    return params.dw_channels, params.dw_pixels


def short_axis_lanes(extent: int) -> int:
    """Lanes for an innermost axis too short for a whole register: the widest power of two of at
    least INTERLEAVED_CHANNELS + 1 that divides `extent`, else 0 (none does: 6, 7 or 9 channels,
    left to the interleaved or scalar forms)."""
    width = 1 << (extent.bit_length() - 1)
    while width > INTERLEAVED_CHANNELS and extent % width:
        width //= 2
    return width if width > INTERLEAVED_CHANNELS else 0
