"""A small API for constructing models op by op (tests, examples, cut-out sub-models).

    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 3])
    w = b.const("w", np.ones([4, 3, 3, 3], np.float32))
    y = b.op("CONV_2D", [x, w, b.const("b", np.zeros(4, np.float32))], [1, 8, 8, 4],
             padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU6")
    b.output(y)
    model = b.build()

Options are the schema's option fields in snake_case; enum-typed fields take their schema names.
Output shapes are given, not inferred: the builder writes what it is told, and LiteRT checks it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import schema
from .ir import BlockwiseQuantization, Model, OpCode, Operator, Quantization, Signature, Subgraph, Tensor, unique_name

fb = schema.fb
DType = str | int | np.dtype | type


def tensor_type(dtype: DType) -> int:
    """A schema TensorType code from a schema name (`"int8"`), a code, or a numpy dtype."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    if isinstance(dtype, str) and dtype.upper() in schema.TENSOR_TYPE_CODES:
        return schema.TENSOR_TYPE_CODES[dtype.upper()]
    try:
        return schema.TENSOR_TYPE_OF_DTYPE[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ValueError(f"no TFLite tensor type for {dtype!r}") from None


def quantization(scale: float | Sequence[float], zero_point: int | Sequence[int] = 0, axis: int = 0) -> Quantization:
    """Affine quantization parameters; pass sequences for per-channel quantization along `axis`."""
    scales = np.atleast_1d(np.asarray(scale, np.float32))
    zps = np.atleast_1d(np.asarray(zero_point, np.int64))
    if zps.size == 1 and scales.size > 1:
        zps = np.repeat(zps, scales.size)
    return Quantization(scale=scales, zero_point=zps, quantized_dimension=axis)


def make_options(op_name: str, values: dict[str, Any]) -> tuple[int, Any]:
    """The (BuiltinOptions code, options object) for `op_name` with snake_case field `values`."""
    union_name = schema.options_name(op_name)
    if union_name is None:
        if values:
            raise TypeError(f"{op_name} takes no options, got {sorted(values)}")
        return 0, None
    options = getattr(fb, union_name + "T")()
    for key, value in values.items():
        field = schema.snake_to_camel(key)
        if not hasattr(options, field):
            allowed = sorted(schema.camel_to_snake(f) for f in vars(options))
            raise TypeError(f"{op_name} has no option {key!r}; it takes {allowed}")
        if isinstance(value, str) and field in schema.OPTION_ENUMS:
            try:
                value = getattr(schema.OPTION_ENUMS[field], value.upper())
            except AttributeError:
                raise ValueError(f"{op_name}: {value!r} is not a valid {key}") from None
        setattr(options, field, value)
    return getattr(fb.BuiltinOptions, union_name), options


class ModelBuilder:
    """Builds a single-subgraph model. Tensors are created in the order they are asked for."""

    def __init__(self) -> None:
        self.graph = Subgraph()
        self._names: set[str] = set()

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: DType = "float32",
        quant: Quantization | None = None,
        shape_signature: Sequence[int] | None = None,
    ) -> Tensor:
        """A new non-constant tensor."""
        t = Tensor(
            name=unique_name(name, self._names),
            shape=tuple(int(d) for d in shape),
            dtype=tensor_type(dtype),
            quantization=quant,
            shape_signature=None if shape_signature is None else tuple(int(d) for d in shape_signature),
        )
        self.graph.tensors.append(t)
        return t

    def input(self, name: str, shape: Sequence[int], dtype: DType = "float32", **kwargs: Any) -> Tensor:
        """A new graph input."""
        t = self.tensor(name, shape, dtype, **kwargs)
        self.graph.inputs.append(t)
        return t

    def const(self, name: str, value: Any, dtype: DType | None = None, quant: Quantization | None = None) -> Tensor:
        """A new constant holding `value` (converted to `dtype` if given; "int4" values in [-8, 7]
        are stored packed, two a byte)."""
        if dtype is not None and tensor_type(dtype) == fb.TensorType.INT4:
            values = np.asarray(value)
            t = self.tensor(name, values.shape, dtype, quant)
            t.data = schema.pack_int4(values)
            return t
        arr = np.asarray(value) if dtype is None else np.asarray(value, dtype=schema.NUMPY_DTYPES[tensor_type(dtype)])
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)  # TFLite models are float32 unless asked otherwise
        if arr.dtype == np.int64 and dtype is None:
            arr = arr.astype(np.int32)
        t = self.tensor(name, arr.shape, arr.dtype, quant)
        t.data = np.require(arr, requirements="C")  # keeps 0-d scalars 0-d
        return t

    def blockwise_const(self, name: str, value: Any, scales: Any, block_size: int, dtype: DType = "int4") -> Tensor:
        """New weights [units, depth] quantized per block of `block_size` input channels, as
        ai-edge-quantizer writes them: the values, and their scales [units, depth / block_size] in
        half precision in a constant of their own that the weights' quantization names."""
        scale_tensor = self.const(f"{name}_scales", np.asarray(scales, np.float16))
        quant = Quantization(blockwise=BlockwiseQuantization(scale_tensor, None, int(block_size)))
        return self.const(name, value, dtype, quant)

    def sparse_const(self, name: str, value: Any, dtype: DType = "float32") -> Tensor:
        """A new constant stored sparse, as the converter's sparsity optimization writes weights:
        every axis dense but the last, which is compressed (CSR: per row its segment of the
        non-zero values and their column indices). TFLite's DENSIFY restores the dense tensor."""
        dense = np.asarray(value, dtype=schema.NUMPY_DTYPES[tensor_type(dtype)])
        rows = dense.reshape(-1, dense.shape[-1])
        segments, indices = [0], []
        for row in rows:
            indices.extend(np.flatnonzero(row).tolist())
            segments.append(len(indices))
        dims = []
        for extent in dense.shape[:-1]:
            dims.append(fb.DimensionMetadataT())
            dims[-1].format, dims[-1].denseSize = fb.DimensionType.DENSE, int(extent)
        last = fb.DimensionMetadataT()
        last.format = fb.DimensionType.SPARSE_CSR
        last.arraySegmentsType = last.arrayIndicesType = fb.SparseIndexVector.Int32Vector
        last.arraySegments, last.arrayIndices = fb.Int32VectorT(), fb.Int32VectorT()
        last.arraySegments.values, last.arrayIndices.values = segments, indices
        sparsity = fb.SparsityParametersT()
        sparsity.traversalOrder = list(range(dense.ndim))
        sparsity.dimMetadata = dims + [last]
        t = self.tensor(name, dense.shape, dense.dtype)
        t.sparsity = sparsity
        t.data = np.frombuffer(rows[rows != 0].tobytes(), np.uint8)  # sparse data stays raw bytes (ir.Tensor)
        return t

    def op(
        self,
        op: str,
        inputs: Sequence[Tensor | None],
        shape: Sequence[int] | Sequence[Sequence[int]],
        dtype: DType | Sequence[DType] | None = None,
        quant: Quantization | None = None,
        name: str | None = None,
        version: int = 1,
        **options: Any,
    ) -> Any:
        """Adds a builtin op and returns its output tensor.

        For several outputs, pass a list of shapes (and optionally a list of dtypes): a list of
        tensors is returned. The output dtype defaults to the first non-constant input's.
        """
        op_name = op.upper()
        options_type, options_obj = make_options(op_name, options)
        opcode = OpCode(schema.builtin_code(op_name), None, version)
        return self._append(opcode, name or op_name.lower(), inputs, shape, dtype, quant,
                            options_type=options_type, options=options_obj)

    def custom(
        self,
        code: str,
        inputs: Sequence[Tensor | None],
        shape: Sequence[int] | Sequence[Sequence[int]],
        dtype: DType | Sequence[DType] | None = None,
        custom_options: bytes = b"",
    ) -> Any:
        """Adds a custom op (`code` is its custom code) and returns its output(s)."""
        opcode = OpCode(fb.BuiltinOperator.CUSTOM, code, 1)
        return self._append(opcode, code.lower(), inputs, shape, dtype, None, custom_options=custom_options)

    def _append(self, opcode: OpCode, name: str, inputs: Sequence[Tensor | None], shape: Any, dtype: Any,
                quant: Quantization | None, **fields: Any) -> Any:
        outputs = self._outputs(name, inputs, shape, dtype, quant)
        self.graph.operators.append(Operator(opcode=opcode, inputs=list(inputs), outputs=outputs, **fields))
        return outputs if _is_multi(shape) else outputs[0]

    def _outputs(self, name: str, inputs: Sequence[Tensor | None], shape: Any, dtype: Any, quant: Any) -> list[Tensor]:
        shapes = list(shape) if _is_multi(shape) else [shape]
        if dtype is None:
            # The first non-constant input decides (SPLIT's axis and similar come first).
            present = [t for t in inputs if t is not None]
            first = next((t for t in present if not t.is_constant), present[0] if present else None)
            dtypes = [first.dtype if first is not None else "float32"] * len(shapes)
        elif isinstance(dtype, (list, tuple)):
            dtypes = list(dtype)
        else:
            dtypes = [dtype] * len(shapes)
        return [self.tensor(name if i == 0 else f"{name}:{i}", s, d, quant) for i, (s, d) in enumerate(zip(shapes, dtypes))]

    def output(self, *tensors: Tensor) -> None:
        """Marks tensors as graph outputs."""
        self.graph.outputs.extend(tensors)

    def build(self, signature: str | None = "serving_default") -> Model:
        """The finished model; with a signature named `signature` over all inputs and outputs."""
        model = Model(subgraphs=[self.graph], description="dnnfusion ModelBuilder")
        if signature:
            model.signatures.append(
                Signature(
                    key=signature,
                    subgraph_index=0,
                    inputs={t.name: t for t in self.graph.inputs},
                    outputs={t.name: t for t in self.graph.outputs},
                )
            )
        return model


def _is_multi(shape: Any) -> bool:
    return len(shape) > 0 and isinstance(shape[0], (list, tuple))
