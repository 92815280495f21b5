"""The graph IR: a TFLite model as Python objects that reference each other.

The flatbuffer links everything by index (operator -> tensor index -> buffer index). Here an
operator holds its `Tensor` objects and a tensor holds its constant data, so passes can add, drop
and reorder things without renumbering; `tflite_tools.writer` assigns indices again on save.

Fields the fusion pipeline never looks at (sparsity, variant tensors, debug metadata, external
buffers) are still carried, verbatim, so a model loaded and saved unchanged means the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from . import schema


@dataclass(eq=False)
class BlockwiseQuantization:
    """Weights quantized per block of `block_size` consecutive input channels: a scale (and zero
    point) per output channel and block, held in tensors of their own, [units, depth / block_size]
    (the schema's BlockwiseQuantization, which names them by index; here by reference, so passes
    that drop or reorder tensors keep them)."""

    scales: Tensor
    zero_points: Tensor | None
    block_size: int
    block_shape: Any = None  # the schema's blockShape, kept verbatim


@dataclass(eq=False)
class Quantization:
    """Affine quantization of a tensor: real = scale * (q - zero_point).

    `scale` and `zero_point` have one entry per tensor, or one per slice along
    `quantized_dimension` (per-channel weights).
    """

    scale: np.ndarray | None = None  # float32
    zero_point: np.ndarray | None = None  # int64
    quantized_dimension: int = 0
    min: np.ndarray | None = None
    max: np.ndarray | None = None
    details_type: int = 0
    details: Any = None  # CustomQuantizationT, kept verbatim (blockwise details: `blockwise`)
    blockwise: BlockwiseQuantization | None = None

    @property
    def tensors(self) -> list[Tensor]:
        """The tensors this quantization refers to (a blockwise one's scales and zero points): they
        belong to the subgraph as much as the tensor quantized, though no operator reads them."""
        b = self.blockwise
        return [] if b is None else [t for t in (b.scales, b.zero_points) if t is not None]

    @property
    def per_channel(self) -> bool:
        """True when there is more than one scale (one per slice of `quantized_dimension`)."""
        return self.scale is not None and len(self.scale) > 1

    def is_empty(self) -> bool:
        """True when nothing is set: the tensor is not quantized."""
        return all(
            v is None or (isinstance(v, np.ndarray) and v.size == 0)
            for v in (self.scale, self.zero_point, self.min, self.max, self.details, self.blockwise)
        )


@dataclass(eq=False)
class Tensor:
    """A tensor of one subgraph. `data` is set for constants (a read-only view, usually)."""

    name: str
    shape: tuple[int, ...]
    dtype: int = schema.fb.TensorType.FLOAT32  # a schema TensorType code
    shape_signature: tuple[int, ...] | None = None  # -1 marks a dynamic dimension
    quantization: Quantization | None = None
    # Constant data. A typed, shaped numpy array for dense numeric types; raw bytes (uint8, 1-D)
    # for sparse tensors and types numpy cannot hold (STRING, INT4, ...).
    data: np.ndarray | None = None
    is_variable: bool = False
    has_rank: bool = False
    sparsity: Any = None  # SparsityParametersT, kept verbatim
    variant_tensors: Any = None  # list[VariantSubTypeT], kept verbatim
    external_buffer: int = 0
    # The DEQUANTIZE / DENSIFY node whose stored constant (fp16, int8, sparse) `data` was decoded
    # from by constant folding. The compiler sees the decoded values; the saved model keeps the
    # compact stored form and the node (fusion.rewrite.fold.restore_decoded).
    decoded_from: Operator | None = None

    @property
    def is_constant(self) -> bool:
        """True when the tensor carries data in the model (weights, biases, shape operands)."""
        return self.data is not None

    @property
    def type_name(self) -> str:
        """The schema's name of the element type (`FLOAT32`)."""
        return schema.tensor_type_name(self.dtype)

    @property
    def numpy_dtype(self) -> np.dtype | None:
        """The numpy dtype of the elements, or None for types numpy cannot represent."""
        return schema.NUMPY_DTYPES.get(self.dtype)

    @property
    def is_dynamic(self) -> bool:
        """True when the shape signature marks any dimension as unknown until run time."""
        return self.shape_signature is not None and any(d < 0 for d in self.shape_signature)

    @property
    def values(self) -> np.ndarray | None:
        """The constant's elements as an array of its shape: `data`, except for INT4, whose packed
        bytes are unpacked into int8 (kernels and packers read weights as int8)."""
        if self.data is not None and self.type_name == "INT4":
            return schema.unpack_int4(self.data, self.shape)
        return self.data

    @property
    def num_elements(self) -> int:
        """Element count of the static shape."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies at run time (constant data length for strings)."""
        bits = schema.element_bits(self.dtype)
        if bits is None:
            return 0 if self.data is None else int(self.data.nbytes)
        return (self.num_elements * bits + 7) // 8

    def __repr__(self) -> str:
        kind = "const " if self.is_constant else ""
        return f"<Tensor {self.name!r} {kind}{self.type_name}{list(self.shape)}>"


@dataclass(frozen=True)
class OpCode:
    """What an operator is: a builtin code (or CUSTOM with a custom code) and its version."""

    builtin: int
    custom_code: str | None = None
    version: int = 1

    @property
    def name(self) -> str:
        """`CONV_2D`, or `CUSTOM:<code>` for custom operators."""
        if self.builtin == schema.fb.BuiltinOperator.CUSTOM:
            return f"CUSTOM:{self.custom_code}"
        return schema.builtin_name(self.builtin)

    @property
    def is_custom(self) -> bool:
        """True for custom (non-builtin) operators."""
        return self.builtin == schema.fb.BuiltinOperator.CUSTOM


@dataclass(eq=False)
class Operator:
    """One node. `inputs` may hold None where TFLite has an omitted optional input (index -1)."""

    opcode: OpCode
    inputs: list[Tensor | None]
    outputs: list[Tensor]
    # The typed options object from the generated schema (`Conv2DOptionsT`), or None.
    options_type: int = 0
    options: Any = None
    options2_type: int = 0
    options2: Any = None
    custom_options: bytes | None = None
    custom_options_format: int = 0
    mutating_variable_inputs: list[bool] | None = None
    intermediates: list[Tensor] = field(default_factory=list)
    debug_metadata_index: int = -1

    @property
    def name(self) -> str:
        """The op's schema name (`CONV_2D`)."""
        return self.opcode.name

    @property
    def fused_activation(self) -> str | None:
        """The fused activation (`RELU6`) when the options carry one other than NONE."""
        act = getattr(self.options, "fusedActivationFunction", 0)
        return schema.ACTIVATION_NAMES.get(act, str(act)) if act else None

    def __repr__(self) -> str:
        ins = ", ".join("-" if t is None else repr(t.name) for t in self.inputs)
        outs = ", ".join(repr(t.name) for t in self.outputs)
        return f"<Operator {self.name}({ins}) -> {outs}>"


@dataclass(eq=False)
class Subgraph:
    """Tensors, operators in execution order, and the graph's inputs and outputs."""

    tensors: list[Tensor] = field(default_factory=list)
    operators: list[Operator] = field(default_factory=list)
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[Tensor] = field(default_factory=list)
    name: str | None = None
    debug_metadata_index: int = -1

    def producers(self) -> dict[int, Operator]:
        """Maps `id(tensor)` to the operator that writes it."""
        return {id(t): op for op in self.operators for t in op.outputs}

    def consumers(self) -> dict[int, list[Operator]]:
        """Maps `id(tensor)` to the operators that read it, in execution order."""
        result: dict[int, list[Operator]] = {}
        for op in self.operators:
            for t in op.inputs:
                if t is not None:
                    result.setdefault(id(t), []).append(op)
        return result


def with_referenced(tensors) -> list[Tensor]:
    """`tensors` (None skipped) followed by the tensors their quantization refers to, each once, in
    order: what a subgraph holding them must list besides them."""
    result: list[Tensor] = []
    seen: set[int] = set()
    for t in tensors:
        for u in ([t] + t.quantization.tensors if t is not None and t.quantization is not None else [t]):
            if u is not None and id(u) not in seen:
                seen.add(id(u))
                result.append(u)
    return result


@dataclass(eq=False)
class Signature:
    """A named entry point: input and output names bound to tensors of one subgraph."""

    key: str
    subgraph_index: int
    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)


@dataclass(eq=False)
class Model:
    """A whole TFLite model. Subgraph 0 is the entry point; others are further signatures' entry
    points and WHILE / IF bodies."""

    subgraphs: list[Subgraph] = field(default_factory=list)
    signatures: list[Signature] = field(default_factory=list)
    # Metadata entries in file order, kept verbatim (`min_runtime_version`, `CONVERSION_METADATA`).
    metadata: list[tuple[str, bytes]] = field(default_factory=list)
    description: str | None = None
    version: int = schema.SCHEMA_VERSION
    # Raw fields kept verbatim for round trips; nothing in the project interprets them.
    external_buffer_groups: Any = None
    external_buffers: Any = None
    # Indices into `metadata` of the entries the deprecated `metadata_buffer` field listed.
    legacy_metadata_buffer: list[int] | None = None

    @property
    def main(self) -> Subgraph:
        """The entry subgraph (index 0)."""
        return self.subgraphs[0]

    def subgraph_label(self, index: int) -> str:
        """What messages and block names call subgraph `index`: the key of the signature that runs
        it, else its name, else `subgraph<index>`."""
        keys = [s.key for s in self.signatures if s.subgraph_index == index and s.key]
        return keys[0] if keys else self.subgraphs[index].name or f"subgraph{index}"

    def operators(self) -> Iterator[tuple[int, Operator]]:
        """All operators with their subgraph index."""
        for i, sg in enumerate(self.subgraphs):
            for op in sg.operators:
                yield i, op



def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ... whichever is not in `taken`; records the choice in `taken`."""
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name
