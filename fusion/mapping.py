"""Mapping types (DNNFusion §3.1, Table 2) and algebraic properties of every TFLite builtin we fuse.

This is the one table that says, per op, how output elements relate to input elements and which
mathematical properties the rewriter may use. Halide lowerings are registered separately, keyed
by the same op names; a test checks the two cover the same ops.

Decisions the paper (Niu et al., DNNFusion, PLDI 2021, §3-4) leaves open, made here:

* **Per-edge classification.** An elementwise op's type is decided per input edge. An operand
  whose shape equals the output's is One-to-One; a broadcast operand is One-to-Many *unless it is
  a constant or a scalar*, which counts as One-to-One. This deviates from the paper's per-operator
  rule (which makes every bias-add and LayerNorm `x - mean` One-to-Many) and follows the digest's
  reading of what the authors actually fused. The op's type is the most complex of its edges.
* **Slicing ops are One-to-One** (as the paper places Slice, Split, Concat), and so are PACK and
  UNPACK (Concat / Split along a new axis). A STRIDED_SLICE with shrink or new-axis masks also
  changes rank, so it is Reorganize.
* **PAD / PADV2 are One-to-One**: each output element is one input element or the constant; no
  input element feeds two outputs. **MIRROR_PAD is One-to-Many**: border elements are copied.
* **Custom ops, control flow and anything not listed are opaque**: never fused, never claimed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

from tflite_tools.model.ir import Operator, Tensor


class MappingType(enum.IntEnum):
    """The five mapping types, ordered by how much they constrain fusion (footnote 1).

    Reorganize and Shuffle are equally strong, as are One-to-Many and Many-to-Many; the integer
    order only breaks those ties for determinism.
    """

    ONE_TO_ONE = 0
    REORGANIZE = 1
    SHUFFLE = 2
    ONE_TO_MANY = 3
    MANY_TO_MANY = 4

    @property
    def short(self) -> str:
        """The paper's abbreviation: OtO, Reorg, Shuffle, OtM, MtM."""
        return _SHORT[self]


_SHORT = {
    MappingType.ONE_TO_ONE: "OtO",
    MappingType.REORGANIZE: "Reorg",
    MappingType.SHUFFLE: "Shuffle",
    MappingType.ONE_TO_MANY: "OtM",
    MappingType.MANY_TO_MANY: "MtM",
}

OtO = MappingType.ONE_TO_ONE
REORG = MappingType.REORGANIZE
SHUFFLE = MappingType.SHUFFLE
OtM = MappingType.ONE_TO_MANY
MtM = MappingType.MANY_TO_MANY


class Prop(enum.Flag):
    """Algebraic properties the rewriter may exploit (DNNFusion §4.2)."""

    NONE = 0
    ASSOCIATIVE = enum.auto()
    COMMUTATIVE = enum.auto()
    DISTRIBUTIVE = enum.auto()


A, C, D = Prop.ASSOCIATIVE, Prop.COMMUTATIVE, Prop.DISTRIBUTIVE


@dataclass(frozen=True)
class OpInfo:
    """What the fusion stage knows about one builtin."""

    mapping: MappingType
    props: Prop = Prop.NONE
    # Elementwise ops take their type per input edge (broadcast operands may be One-to-Many).
    elementwise: bool = False
    # Overrides the mapping for a particular op instance (e.g. STRIDED_SLICE with masks).
    refine: Callable[[Operator], MappingType] | None = None


def _strided_slice(op: Operator) -> MappingType:
    opts = op.options
    masks = getattr(opts, "shrinkAxisMask", 0) or getattr(opts, "newAxisMask", 0) or getattr(opts, "ellipsisMask", 0)
    return REORG if masks else OtO


def _ew(props: Prop = Prop.NONE) -> OpInfo:
    return OpInfo(OtO, props, elementwise=True)


# Properties: ADD/MUL/MAXIMUM/MINIMUM are associative and commutative; MUL distributes over
# ADD/SUB and DIV distributes from the right; NEG commutes with scaling (-(a*b) = (-a)*b) and
# distributes over sums; SQUARE, SQRT, RSQRT, ABS and EXP are homomorphisms the Table 4 rules
# reassociate through (|a|*|b| = |a*b|, sqrt(b)*sqrt(b) = b, exp(a)*exp(b) = exp(a+b)); SUM and
# REDUCE_PROD commute with the elementwise ops they absorb (ReduceProd(Exp) = Exp(ReduceSum)).
OPS: dict[str, OpInfo] = {
    # One-to-One, elementwise
    "ADD": _ew(A | C), "SUB": _ew(D), "MUL": _ew(A | C | D), "DIV": _ew(D),
    "MAXIMUM": _ew(A | C), "MINIMUM": _ew(A | C), "POW": _ew(), "SQUARED_DIFFERENCE": _ew(C),
    "RELU": _ew(), "RELU6": _ew(), "RELU_N1_TO_1": _ew(), "LEAKY_RELU": _ew(), "PRELU": _ew(),
    "LOGISTIC": _ew(), "TANH": _ew(), "HARD_SWISH": _ew(), "GELU": _ew(), "ELU": _ew(),
    "EXP": _ew(A), "LOG": _ew(), "SQRT": _ew(A), "RSQRT": _ew(A), "SQUARE": _ew(A), "ABS": _ew(A),
    "NEG": _ew(C | D), "SIN": _ew(), "COS": _ew(), "FLOOR": _ew(), "CEIL": _ew(), "ROUND": _ew(),
    "CAST": _ew(), "QUANTIZE": _ew(), "DEQUANTIZE": _ew(),
    "SELECT": _ew(), "SELECT_V2": _ew(),
    "LESS": _ew(), "LESS_EQUAL": _ew(), "GREATER": _ew(), "GREATER_EQUAL": _ew(),
    "EQUAL": _ew(C), "NOT_EQUAL": _ew(C),
    "LOGICAL_AND": _ew(A | C), "LOGICAL_OR": _ew(A | C), "LOGICAL_NOT": _ew(),
    # One-to-One, data movement with a known index function
    "CONCATENATION": OpInfo(OtO), "SLICE": OpInfo(OtO), "STRIDED_SLICE": OpInfo(OtO, refine=_strided_slice),
    "SPLIT": OpInfo(OtO), "SPLIT_V": OpInfo(OtO), "PACK": OpInfo(OtO), "UNPACK": OpInfo(OtO),
    "PAD": OpInfo(OtO), "PADV2": OpInfo(OtO),
    # One-to-Many
    "MIRROR_PAD": OpInfo(OtM), "BROADCAST_TO": OpInfo(OtM), "TILE": OpInfo(OtM),
    "GATHER": OpInfo(OtM), "GATHER_ND": OpInfo(OtM), "DYNAMIC_UPDATE_SLICE": OpInfo(OtM),
    "RESIZE_BILINEAR": OpInfo(OtM), "RESIZE_NEAREST_NEIGHBOR": OpInfo(OtM),
    # Many-to-Many
    "CONV_2D": OpInfo(MtM), "DEPTHWISE_CONV_2D": OpInfo(MtM), "TRANSPOSE_CONV": OpInfo(MtM), "CONV_3D": OpInfo(MtM),
    "CONV_3D_TRANSPOSE": OpInfo(MtM),
    "FULLY_CONNECTED": OpInfo(MtM), "BATCH_MATMUL": OpInfo(MtM),
    "AVERAGE_POOL_2D": OpInfo(MtM), "MAX_POOL_2D": OpInfo(MtM),
    "MEAN": OpInfo(MtM), "SUM": OpInfo(MtM, C), "REDUCE_MAX": OpInfo(MtM), "REDUCE_MIN": OpInfo(MtM),
    "REDUCE_PROD": OpInfo(MtM, C),
    "SOFTMAX": OpInfo(MtM), "LOG_SOFTMAX": OpInfo(MtM), "L2_NORMALIZATION": OpInfo(MtM),
    "ARG_MAX": OpInfo(MtM), "ARG_MIN": OpInfo(MtM),
    # Reorganize
    "RESHAPE": OpInfo(REORG), "SQUEEZE": OpInfo(REORG), "EXPAND_DIMS": OpInfo(REORG),
    # Shuffle
    "TRANSPOSE": OpInfo(SHUFFLE), "DEPTH_TO_SPACE": OpInfo(SHUFFLE), "SPACE_TO_DEPTH": OpInfo(SHUFFLE),
    # MediaPipe's custom CNN ops (segmentation models carry them; XNNPACK runs them in stock LiteRT):
    # a transpose convolution with bias, max pooling that also returns where each maximum was, and
    # the unpooling that puts values back there.
    "CUSTOM:Convolution2DTransposeBias": OpInfo(MtM), "CUSTOM:MaxPoolingWithArgmax2D": OpInfo(MtM),
    "CUSTOM:MaxUnpooling2D": OpInfo(OtM),
}

# The elementwise ops: each output element reads its inputs at its own index (broadcast operands at
# the broadcast index), so the code generator may compute one inside any tile of its consumer, and
# each has its lowering in halide_gen/lower/elementwise.py. Data movement that is One-to-One in the
# paper's sense (CONCATENATION, SLICE, PAD) shifts indices and is not among them.
ELEMENTWISE = frozenset(name for name, info in OPS.items() if info.elementwise)


def op_info(op: Operator) -> OpInfo | None:
    """The table entry for `op`, or None when the op is opaque (control flow, unknown builtins and
    custom ops other than MediaPipe's three above)."""
    return OPS.get(op.name)


def is_scalar(t: Tensor) -> bool:
    """True for a one-element tensor (it broadcasts without an index function worth tracking)."""
    return t.num_elements == 1


def edge_type(op: Operator, index: int) -> MappingType | None:
    """The mapping type of the edge from input `index` to the op's outputs (None if opaque).

    For elementwise ops a broadcast operand is One-to-Many, except a constant or a scalar, which
    counts as One-to-One (see the module docstring).
    """
    info = op_info(op)
    if info is None:
        return None
    if not info.elementwise:
        return info.refine(op) if info.refine else info.mapping
    t = op.inputs[index]
    if t is None or t.is_constant or is_scalar(t) or not op.outputs:
        return OtO
    return OtO if tuple(t.shape) == tuple(op.outputs[0].shape) else OtM


def op_mapping(op: Operator) -> MappingType | None:
    """The op's mapping type: the most complex of its edges (None if opaque)."""
    info = op_info(op)
    if info is None:
        return None
    if not info.elementwise:
        return info.refine(op) if info.refine else info.mapping
    edges = [edge_type(op, i) for i, t in enumerate(op.inputs) if t is not None]
    return max((e for e in edges if e is not None), default=OtO)
