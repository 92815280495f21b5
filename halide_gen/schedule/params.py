"""The CPU schedule templates' numbers: register-tile shapes and thresholds per CPU family, as plain
tables (like XNNPACK's per-microarchitecture configs), and the named variants `fuse --autoschedulers`
times beside them. Each comment gives the reason for a value; the measurements that chose it are in
bench/RESULTS-history.md, "Schedule parameters and code choices: the measurements behind them"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection


@dataclass(frozen=True)
class CpuParams:
    """One CPU family's template parameters (lanes of the float type its register tiles sum in;
    register tiles as channels x pixels)."""

    lanes: int
    conv_channels: int
    conv_pixels: int
    dw_channels: int
    dw_pixels: int
    mm_channels: int  # fully-connected / batch-matmul: output columns per tile
    mm_rows: int
    # Smallest float32 intermediates (bytes, summed over a conv chain) worth streaming through row
    # buffers: below that, strips only add halo recomputation. Tests set 0 to stream small chains.
    stream_bytes: int = 1 << 20
    # Fewest output rows per streamed strip: a few coarse tasks, little halo. Tests set 2 so that
    # small maps are cut into several strips too.
    strip_rows: int = 8
    # Pixels of a convolution's tile on rows that are a multiple of this many (0: conv_pixels
    # everywhere): twice the pixels per weight load where whole tiles of them fill the row.
    conv_row_pixels: int = 0
    # Vector registers a convolution's or matrix product's register tile may fill. Nonzero: the
    # tile shape is chosen per op by tiles.modelled_tile; 0: the fixed shapes above.
    registers: int = 0
    # Reduction steps per input load: at 4, a pointwise conv or matrix product loads 4 consecutive
    # input channels of a pixel in one vector and multiplies by each lane (NEON's `fmla` by element),
    # instead of one broadcast load per step.
    reduce_unroll: int = 1
    # Fewest steps a load may serve where `reduce_unroll` does not divide a matrix product's depth
    # (halved down to this; below it one step a broadcast load): a head of 26 in pairs of 64-bit loads.
    reduce_unroll_least: int = 0
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
    # Work (elements times the terms each sums) below which a stage's loop stays serial: handing
    # its tasks to the delegate's pool costs more than such a stage takes (tiles.parallel_worthwhile).
    parallel_work: int = 1 << 14
    # The same for the stages of a block with no convolution or matrix product (a LayerNorm, a
    # softmax): a few operations per element, several stages each handed to the threads.
    parallel_light_work: int = 1 << 16
    # Weight bytes of a float convolution above which its output-channel tiles go outside its rows
    # (0: never): about the core's L2. Not set for NEON, whose measure (instructions) cannot see it.
    weight_cache_bytes: int = 0
    # Weight bytes of a matrix product with constant weights at most which its channel tiles go
    # inside its row tiles (0: never): its weights stay in L1 anyway, and each input row is then read
    # once and each output row written whole, instead of once per channel tile (SegFormer's 32 -> 128
    # projections over 16384 tokens).
    small_weight_bytes: int = 0
    # Ways of the core's L1 data cache (0: not modelled) and the bytes one way spans: a register
    # tile whose pixels (a matrix product's rows) put more than `l1_ways` lines in one set evicts its
    # own inputs every few reduction steps (tiles.pixels_in_l1_sets).
    l1_ways: int = 0
    l1_way_bytes: int = 4096
    # Independent accumulator vectors a float register tile keeps at least (1: no minimum): FMA
    # latency times the FMA pipes. A tile of fewer (a conv on one pixel into a few channels, a
    # matrix-vector product) keeps interleaved partial sums (register_tile.interleaved_chains).
    min_chains: int = 1
    # Most query rows of an attention core's tiles (both products; 0: mm_rows).
    attention_rows: int = 0
    # Score matrices ([heads, queries, keys] float32) of at most this many bytes are computed whole,
    # a stage at a time, in an attention core's kernel; larger ones a tile of query rows at a time
    # (attention.schedule_attention), whose tiles read the keys and values again.
    attention_whole_bytes: int = 0
    # A transposed tile (schedule.vectors.tile_transpose) staged: its input rows loaded a vector each,
    # then transposed in registers. On NEON 25 instructions a 4 x 4 tile where lane loads took 34; on
    # x86 LLVM's own shuffles of the unrolled reads are faster (bench/RESULTS.md, "Decoder corpus").
    stage_transpose_tiles: bool = False


# AVX-512 (16 lanes, 32 registers): 32 x 7 conv tiles (7 divides MobileNet's rows) and 32 x 14 on rows
# that 14 divides, 32 x 12 matrix-product tiles: enough accumulators to hide two FMA pipes' latency.
# L1: 8 ways of 4 KB.
# Attention in tiles of up to 12 query rows, as many as divide the queries (attention.query_tile_rows:
# 8 for 128 or 512, 12 for 300), at every size: a small core a stage at a time, each stage its own
# parallel loop, was slower at two threads than at one. Conv chains stream from 4 MB of
# intermediates: below that they stay in the last-level cache, and a strip's halo rows (a 5x5
# stride-2 depthwise conv recomputes 3 expand-conv rows in 16) cost more than the traffic saved.
X86 = CpuParams(lanes=16, conv_channels=32, conv_pixels=7, dw_channels=16, dw_pixels=8, mm_channels=32, mm_rows=12,
                dot_tile=(32, 7), conv_row_pixels=14, weight_cache_bytes=1 << 20, small_weight_bytes=64 << 10,
                l1_ways=8, attention_rows=12, min_chains=8, stream_bytes=4 << 20)

# AVX2 (8 lanes, 16 registers): AVX-512's tiles would need twice the registers there are, and every
# accumulator lived on the stack. Float matrix products and convolutions in 16 x 6 tiles (12
# accumulators, two weight vectors and a broadcast input: 15 of 16); int8 sums, which widen through
# temporaries, in 16 x 4; depthwise tiles of 8 x 4 (4 accumulators beside 9 taps' weights); attention
# in tiles of up to 6 query rows. The rest as AVX-512's: the caches are alike.
X86_AVX2 = replace(X86, lanes=8, conv_channels=16, conv_pixels=6, conv_row_pixels=6, dw_channels=8, dw_pixels=4,
                   mm_channels=16, mm_rows=6, dot_tile=(16, 4), attention_rows=6)

# The x86-64 baseline (SSE2: 4 lanes, 16 registers): AVX2's float tiles at half the channels. Its int8
# sums keep 32 channels: a dot-product tile narrower than the weights' blocks of 32 loads them by the
# byte (an 8-channel tile ran an int8 FULLY_CONNECTED at 3x the time; bench/x86_tiles.py --build sse2).
X86_SSE = replace(X86_AVX2, lanes=4, conv_channels=8, dw_channels=4, mm_channels=8, dot_tile=(32, 4))

# NEON (4 lanes, 32 registers): tiles modelled per op (registers=32), 4 reduction steps per input
# vector load (`fmla` by element; 2 where 4 do not divide the reduction) two groups to a loop
# iteration, 4 SDOT groups per input load. Attention cores of up to 1 MB of scores a stage at a
# time: in row tiles, which read the keys and values again, bert_small took 1.09x XNNPACK's A76
# cycles, 0.97x whole.
NEON = CpuParams(lanes=4, conv_channels=16, conv_pixels=6, dw_channels=8, dw_pixels=4, mm_channels=16, mm_rows=6,
                 registers=32, reduce_unroll=4, reduce_unroll_least=2, reduce_groups_unrolled=2,
                 elementwise_vectors=4, dot_groups=4, narrow_dw_tile=(16, 4), attention_whole_bytes=1 << 20,
                 stage_transpose_tiles=True)

# NEON computing in half precision (`-fp16` targets): 8 lanes a register, so each tile's channels
# double and its accumulators stay as many registers; 8 reduction steps per input load, a whole
# register (4, half of one, were staged through the stack: 1.4-1.6 FMLAs a cycle on the A76, 2.0 now).
NEON_FP16 = replace(NEON, lanes=8, conv_channels=32, dw_channels=16, mm_channels=32, narrow_dw_tile=(16, 4),
                    reduce_unroll=8, reduce_unroll_least=8, reduce_groups_unrolled=1)


# Fewest output rows a convolution shares among threads one row per task: below that (a 7x7 or
# 1x1 map) its tasks are rows times groups of output-channel tiles, about this many in all, so
# that 8 threads have a task each. Not for depthwise convolutions, whose channel groups cost more
# at two threads than they gave.
ROW_TASKS = 8
# Fewest tasks a matrix product's loop is cut into where its rows allow (channel tiles times groups
# of row tiles): a thread that starts late, or is slower, then leaves the others a small task to
# wait on, not one of a few large ones. Its weights are read once per group of rows. Not below
# MATMUL_TASK_WORK multiply-adds a task, whose hand-over would cost more than it shares.
MATMUL_TASKS = 16
MATMUL_TASK_WORK = 1 << 18

# Innermost axes this short (an RGB image's 3 channels) are unrolled inside vectors of pixels.
INTERLEAVED_CHANNELS = 4

# Innermost axes of up to this many channels, whole vectors, are unrolled: each vector's channels
# are then constants, so a CONCATENATION's select between its inputs (and their clamps) fold away.
UNROLLED_CHANNELS = 64

# Maps of at most this many pixels (over more than one row) are tiled in bands of rows, as many as
# keep a tile's accumulators to the templates' budget (x86): a tile of one row of a 2x2 or 4x4 map
# read all the weights once per row.
WHOLE_MAP_PIXELS = 16

CACHE_LINE = 64  # bytes


# The CPU template parameters of each CPU family a TargetSpec may name: per vector extension, the
# widest first (cpu_params picks the first whose features a target has).
CPU_PARAMS: dict[str, tuple[tuple[tuple[str, ...], CpuParams], ...]] = {
    "x86": ((("avx512",), X86), (("avx2",), X86_AVX2), ((), X86_SSE)),
    "arm": (((), NEON),),
}


def cpu_params(family: str, features: Collection[str]) -> CpuParams:
    """The template parameters of a CPU family for a target with these Halide feature names: a
    register tile sized to the registers its vector extension has."""
    return next(params for needs, params in CPU_PARAMS[family] if set(needs) <= set(features))

# Named variants of a CPU family's template parameters: the defaults were measured on one CPU and
# tile shapes do not carry to the next, so where a default beat an alternative on one host, the
# alternative is a variant that `fuse --autoschedulers` times per block on the machine it runs on
# (halide_gen.profile.schedule_sources) next to the defaults and Halide's autoschedulers.
# "template-7px": x86 conv tiles of 7 pixels on every row (conv_row_pixels off): the 32 x 14 tiles
# of 14-pixel rows were chosen on a Sapphire Rapids Xeon; a Zen 5 host had chosen 32 x 7 among others.
TEMPLATE_VARIANTS: dict[str, dict[str, dict]] = {"x86": {"template-7px": {"conv_row_pixels": 0}}, "arm": {}, "gpu": {}}
