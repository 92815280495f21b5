"""Weight packing: constant operands reordered once (at build time) into the layout kernels load.

TFLite stores conv filters as [O, kh, kw, I] and fully-connected weights as [units, in]: the output
channel is the outermost axis, so a vector of output channels is a strided gather. Packed, the
output channels come in tiles of CHANNEL_TILE, innermost, padded with zeros, so every vector load
is dense and a tile that runs past the last channel still reads memory that exists
(weights packed once, at init, as XNNPACK does: re-laying them out per call cost more than the
convolution saved when measured on the x86 host).

Int8 weights of a dot-product reduction (lower/quantized.py) are packed 4-deep: the four
consecutive input channels an output channel sums in one `sdot` (ARMv8.2) lie together, then the
output channels of a tile, so one 16-byte load feeds four output channels ("dot4"). Their sums per
output channel ("channel_sums", int32; a depthwise filter's "tap_sums") fold the input zero point
into the bias.

A kernel argument records the packer's name; whoever feeds the kernel (the JIT, the test runners,
the delegate bundle) applies the same function to the constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

# Channels are padded to a multiple of this: every CPU template's channel tile divides it
# (x86: 32 = 2 AVX-512 vectors; NEON: 16 = 4 vectors).
CHANNEL_TILE = 32
# Input channels summed by one dot-product instruction (ARM sdot, x86 vpdpbusd): 4 bytes per lane.
DOT_DEPTH = 4


def padded(n: int, multiple: int | None = None) -> int:
    """`n` rounded up to a multiple (of CHANNEL_TILE by default)."""
    multiple = multiple or CHANNEL_TILE
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class Packer:
    """A named layout change of a constant: its new shape, and the numpy function doing it."""

    name: str
    shape: Callable[[tuple[int, ...]], tuple[int, ...]]
    apply: Callable[[np.ndarray], np.ndarray]
    dtype: str | None = None  # the packed element type (TFLite's name), when not the constant's own


def _pad_last(a: np.ndarray) -> np.ndarray:
    out = np.zeros(a.shape[:-1] + (padded(a.shape[-1]),), a.dtype)
    out[..., : a.shape[-1]] = a
    return out


def _blocked(a: np.ndarray) -> np.ndarray:
    """[O, ...] -> [O_padded / CHANNEL_TILE, ..., CHANNEL_TILE]: each tile of output channels holds
    all its weights contiguously."""
    out = np.zeros((padded(a.shape[0]),) + a.shape[1:], a.dtype)
    out[: a.shape[0]] = a
    tiled = out.reshape((out.shape[0] // CHANNEL_TILE, CHANNEL_TILE) + a.shape[1:])
    return np.moveaxis(tiled, 1, -1)


def _blocked_shape(s: tuple[int, ...]) -> tuple[int, ...]:
    """The shape `_blocked` makes of [O, ...]: [O_padded / CHANNEL_TILE, ..., CHANNEL_TILE]."""
    return (padded(s[0]) // CHANNEL_TILE,) + tuple(s[1:]) + (CHANNEL_TILE,)


def _last_blocked(a: np.ndarray) -> np.ndarray:
    """[..., O] -> [O_padded / CHANNEL_TILE, ..., CHANNEL_TILE]: `_blocked` of a filter whose output
    channel is its innermost axis (CONV_3D's [kd, kh, kw, I, O])."""
    return _blocked(np.moveaxis(a, -1, 0))


def _before_last_blocked(a: np.ndarray) -> np.ndarray:
    """[..., O, I] -> [O_padded / CHANNEL_TILE, ..., I, CHANNEL_TILE]: `_blocked` of a filter whose
    output channel is its next-to-innermost axis (CONV_3D_TRANSPOSE's [kd, kh, kw, O, I])."""
    return _blocked(np.moveaxis(a, -2, 0))


def _dot4(a: np.ndarray) -> np.ndarray:
    """[O, *mid, I] -> [*mid, I/4, O_padded, 4]: the 4 consecutive input channels one dot-product
    lane sums, innermost (I is a multiple of 4)."""
    o, i = a.shape[0], a.shape[-1]
    out = np.zeros((padded(o),) + a.shape[1:], a.dtype)
    out[:o] = a
    grouped = out.reshape((out.shape[0],) + a.shape[1:-1] + (i // DOT_DEPTH, DOT_DEPTH))  # [O, *mid, I/4, 4]
    return np.moveaxis(grouped, 0, -2)


def _dot4_blocked(a: np.ndarray) -> np.ndarray:
    """[O, *mid, I] -> [O_padded / CHANNEL_TILE, *mid, I/4, CHANNEL_TILE, 4]: `_dot4` within each
    tile of output channels, each tile's weights contiguous (I is a multiple of 4)."""
    grouped = _dot4(a)  # [*mid, I/4, O_padded, 4]
    tiles = grouped.shape[-2] // CHANNEL_TILE
    split = grouped.reshape(grouped.shape[:-2] + (tiles, CHANNEL_TILE, DOT_DEPTH))
    return np.moveaxis(split, -3, 0)


def _dot4_rows(a: np.ndarray) -> np.ndarray:
    """CONV_2D [O, kh, kw, I] -> [kh, ceil(kw*I/4), O_padded, 4]: each filter row's kw*I taps as one
    run of input bytes (a row of an NHWC image), zero-padded to whole groups of 4."""
    rows = a.reshape(a.shape[0], a.shape[1], -1)
    out = np.zeros(rows.shape[:2] + (padded(rows.shape[2], DOT_DEPTH),), a.dtype)
    out[..., : rows.shape[2]] = rows
    return _dot4(out)


def _channel_sums(a: np.ndarray) -> np.ndarray:
    """[O, ...] int8 -> [O_padded] int32: each output channel's weights summed."""
    out = np.zeros(padded(a.shape[0]), np.int32)
    out[: a.shape[0]] = a.reshape(a.shape[0], -1).astype(np.int32).sum(axis=1)
    return out


def _tap_sums(a: np.ndarray) -> np.ndarray:
    """DEPTHWISE_CONV_2D int8 [1, kh, kw, C] -> [C_padded] int32: each channel's taps summed. The
    kernels reading them add two int8 products in int16, which overflows only for (-128)^2 twice:
    weights holding -128 are refused (TFLite's symmetric int8 weights never do)."""
    if a.dtype == np.int8 and a.size and int(a.min()) == -128:
        raise ValueError("int8 depthwise weights hold -128: two products would overflow int16")
    out = np.zeros(padded(a.shape[-1]), np.int32)
    out[: a.shape[-1]] = a.reshape(-1, a.shape[-1]).astype(np.int32).sum(axis=0)
    return out


# The block sizes of weights quantized per block that kernels take (ai-edge-quantizer's: BLOCKWISE_32 ... _256).
WEIGHT_BLOCKS = (32, 64, 128, 256)


def _block_sums(block: int) -> Callable[[np.ndarray], np.ndarray]:
    """[O, I] int8 -> int32 [O_padded / CHANNEL_TILE, I / block, CHANNEL_TILE]: each output channel's
    weights summed per block of `block` input channels, in tiles of output channels."""
    def apply(a: np.ndarray) -> np.ndarray:
        sums = a.astype(np.int32).reshape(a.shape[0], a.shape[1] // block, block).sum(axis=2, dtype=np.int32)
        return _blocked(sums)
    return apply


def block_sums_packer(block: int) -> str:
    """The name of the packer of weights' sums per block of `block` input channels."""
    return f"block_sums{block}"


PACKERS: dict[str, Packer] = {
    # Per-channel vectors (biases, depthwise filters [1, kh, kw, C]): pad the channel axis
    "pad_channels": Packer("pad_channels", lambda s: s[:-1] + (padded(s[-1]),), _pad_last),
    # CONV_2D / TRANSPOSE_CONV filters and FULLY_CONNECTED weights [O, ...] -> [O/32, ..., 32]: each
    # tile of output channels holds all its weights contiguously. Read cold inside a model (its other
    # blocks evict them), they must stream: laid out output-channel innermost ([..., O]), a tile
    # gathers 128-byte pieces a whole channel count apart.
    "o_blocked": Packer("o_blocked", _blocked_shape, _blocked),
    # CONV_3D filters [kd, kh, kw, I, O] -> [O/32, kd, kh, kw, I, 32]: "o_blocked" for a filter whose
    # output channel is innermost. As stored, a tile's 128-byte pieces lay O * 4 bytes apart, which
    # map to a few of the L2's sets: a 512-channel layer's tile slice (1.8 MB) never stayed in it.
    "o_last_blocked": Packer("o_last_blocked", lambda s: (padded(s[-1]) // CHANNEL_TILE,) + tuple(s[:-1])
                             + (CHANNEL_TILE,), _last_blocked),
    # CONV_3D_TRANSPOSE filters [kd, kh, kw, O, I] -> [O/32, kd, kh, kw, I, 32]: as stored, a tile's
    # channels lay I values apart, a gather per vector.
    "o_before_last_blocked": Packer("o_before_last_blocked", lambda s: (padded(s[-2]) // CHANNEL_TILE,)
                                    + tuple(s[:-2]) + (s[-1], CHANNEL_TILE), _before_last_blocked),
    # Dot-product weights [O, *mid, I] -> [*mid, I/4, O_padded, 4] (CONV_2D: [kh, kw, I/4, O, 4];
    # FULLY_CONNECTED: [I/4, O, 4]).
    "dot4": Packer("dot4", lambda s: tuple(s[1:-1]) + (s[-1] // DOT_DEPTH, padded(s[0]), DOT_DEPTH), _dot4),
    # FULLY_CONNECTED dot-product weights [O, I] -> [O/32, I/4, 32, 4]: "dot4" within each tile of
    # output channels, the tile's weights contiguous, so a matrix-vector product streams them in
    # order (lower/nn.py says why FCs take it).
    "dot4_blocked": Packer("dot4_blocked", lambda s: (padded(s[0]) // CHANNEL_TILE,) + tuple(s[1:-1])
                           + (s[-1] // DOT_DEPTH, CHANNEL_TILE, DOT_DEPTH), _dot4_blocked),
    # Narrow-input CONV_2D weights [O, kh, kw, I] -> [kh, ceil(kw*I/4), O_padded, 4].
    "dot4_rows": Packer("dot4_rows", lambda s: (s[1], -(-s[2] * s[3] // DOT_DEPTH), padded(s[0]), DOT_DEPTH),
                        _dot4_rows),
    # Int8 weights [O, ...] -> int32 [O_padded]: sum over all but the output channel.
    "channel_sums": Packer("channel_sums", lambda s: (padded(s[0]),), _channel_sums, dtype="INT32"),
    # Int8 depthwise weights [1, kh, kw, C] -> int32 [C_padded]: sum over the taps.
    "tap_sums": Packer("tap_sums", lambda s: (padded(s[-1]),), _tap_sums, dtype="INT32"),
    # Half-precision per-channel values (a blockwise quantization's scales [O, blocks]) ->
    # float32 [O_padded / 32, ..., 32]: "o_blocked", widened once so kernels convert nothing.
    "o_blocked_widened": Packer("o_blocked_widened", _blocked_shape, lambda a: _blocked(np.asarray(a, np.float32)),
                                dtype="FLOAT32"),
    # Weights quantized per block [O, I] -> int32 [O_padded / 32, I / block, 32]: sums per block.
    **{block_sums_packer(block): Packer(block_sums_packer(block),
                                        lambda s, b=block: _blocked_shape((s[0], s[1] // b)),
                                        _block_sums(block), dtype="INT32") for block in WEIGHT_BLOCKS},
}


# The largest finite half-precision value.
FLOAT16_MAX = 65504.0


def half_saturated(data: np.ndarray) -> np.ndarray:
    """Float values in half precision as the delegate converts weights (delegate/src/pack.cc,
    FloatsToHalves): rounded to nearest even, a finite value past 65504 saturating at +-65504 (an
    attention mask's -3.4e38 times 0 is then 0, not -inf * 0 = NaN); infinities and NaN stay."""
    wide = np.asarray(data, np.float32)
    return np.where(np.isinf(wide), wide, np.clip(wide, -FLOAT16_MAX, FLOAT16_MAX)).astype(np.float16)


def pack(name: str | None, data: np.ndarray) -> np.ndarray:
    """`data` in the layout `name` asks for (unchanged when `name` is None)."""
    return np.asarray(data) if name is None else np.ascontiguousarray(PACKERS[name].apply(np.asarray(data)))
