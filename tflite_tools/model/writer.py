"""Writing the graph IR back to a `.tflite` flatbuffer.

Indices are assigned afresh: buffer 0 is the empty sentinel TFLite expects, then one buffer per
distinct constant (tensors that shared memory on load share a buffer again), then the metadata.
Constant data is 16-byte aligned in the file, as the converter writes it, so a runtime that maps
the file can use weights in place.
"""

from __future__ import annotations

import os
from typing import Any

import flatbuffers
import numpy as np

from . import schema
from .atomic import write_bytes_atomic
from .errors import ModelError
from .ir import Model, OpCode, Operator, Quantization, Subgraph, Tensor

fb = schema.fb

# The converter aligns every buffer to 16 bytes; XNNPACK and NEON loads like it that way.
BUFFER_ALIGNMENT = 16


class _AlignedBufferT(fb.BufferT):
    """A BufferT whose data vector is written with BUFFER_ALIGNMENT instead of 1."""

    def Pack(self, builder: flatbuffers.Builder) -> int:  # noqa: N802 - generated API name
        data = None
        if self.data is not None:
            payload = memoryview(self.data).cast("B")
            builder.StartVector(1, len(payload), BUFFER_ALIGNMENT)
            builder.head = builder.Head() - len(payload)
            builder.Bytes[builder.head : builder.head + len(payload)] = payload
            data = builder.EndVector()
        fb.BufferStart(builder)
        if data is not None:
            fb.BufferAddData(builder, data)
        return fb.BufferEnd(builder)


def save(model: Model, path: str | os.PathLike) -> None:
    """Writes `model` to `path` atomically: a failure leaves no partial file behind."""
    data = serialize(model)
    try:
        write_bytes_atomic(path, data)
    except OSError as exc:
        raise ModelError(f"{path}: cannot write ({exc.strerror or exc})") from None


def serialize(model: Model) -> bytes:
    """The model as `.tflite` flatbuffer bytes."""
    packed = _Packer(model).model()
    data_bytes = sum(len(b.data) for b in packed.buffers if b.data is not None)
    if data_bytes >= flatbuffers.Builder.MAX_BUFFER_SIZE:
        raise ModelError(f"model holds {data_bytes} bytes of constants; flatbuffers are limited to 2 GiB")
    builder = flatbuffers.Builder(data_bytes + (1 << 16))
    try:
        builder.Finish(packed.Pack(builder), file_identifier=schema.FILE_IDENTIFIER)
    except flatbuffers.builder.BuilderSizeError as exc:
        raise ModelError(f"model does not fit in one flatbuffer ({exc})") from None
    return builder.Output()


def _contiguous_bytes(data: np.ndarray) -> np.ndarray:
    """A C-contiguous little-endian uint8 view (or copy, if the array is strided) of `data`."""
    arr = np.ascontiguousarray(data)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr.reshape(-1).view(np.uint8)


class _Packer:
    """Builds the index-linked `ModelT` from the IR."""

    def __init__(self, model: Model):
        self.ir = model
        self.buffers: list[Any] = [_AlignedBufferT()]
        # (address, nbytes) of constant memory already given a buffer. The arrays themselves are
        # kept in `self.keep` so no address is freed and reused while packing.
        self.buffer_of: dict[tuple[int, int], int] = {}
        self.keep: list[np.ndarray] = []
        self.opcodes: dict[OpCode, int] = {}
        # Per subgraph, the function mapping its tensors to indices (signatures need it).
        self.tensor_index: dict[int, Any] = {}

    def model(self) -> Any:
        m = self.ir
        if not m.subgraphs:
            raise ModelError("model has no subgraphs")
        raw = fb.ModelT()
        raw.version = m.version
        raw.description = _encode(m.description)
        raw.subgraphs = [self.subgraph(si, sg) for si, sg in enumerate(m.subgraphs)]
        raw.signatureDefs = [self.signature(s) for s in m.signatures] or None
        metadata_buffers = [self.add_buffer(np.frombuffer(data, np.uint8)) for _, data in m.metadata]
        raw.metadata = [_metadata(name, b) for (name, _), b in zip(m.metadata, metadata_buffers)] or None
        if m.legacy_metadata_buffer is not None:
            raw.metadataBuffer = [metadata_buffers[i] for i in m.legacy_metadata_buffer]
        raw.operatorCodes = [_opcode(c) for c in self.opcodes]
        raw.buffers = self.buffers
        raw.externalBufferGroups = m.external_buffer_groups
        raw.externalBuffers = m.external_buffers
        return raw

    def add_buffer(self, raw_bytes: np.ndarray) -> int:
        if raw_bytes.size == 0:
            return 0
        buf = _AlignedBufferT()
        buf.data = raw_bytes
        self.buffers.append(buf)
        return len(self.buffers) - 1

    def constant_buffer(self, data: np.ndarray) -> int:
        raw = _contiguous_bytes(data)
        key = (raw.__array_interface__["data"][0], raw.nbytes)
        if key not in self.buffer_of:
            self.keep.append(raw)
            self.buffer_of[key] = self.add_buffer(raw)
        return self.buffer_of[key]

    def subgraph(self, si: int, sg: Subgraph) -> Any:
        index = {id(t): i for i, t in enumerate(sg.tensors)}
        if len(index) != len(sg.tensors):
            raise ModelError(f"subgraph {si}: a tensor appears twice in its tensor list")

        def idx(t: Tensor | None, what: str) -> int:
            if t is None:
                return -1
            try:
                return index[id(t)]
            except KeyError:
                raise ModelError(f"subgraph {si}: {what} uses tensor {t.name!r}, which is not in the subgraph") from None

        raw = fb.SubGraphT()
        raw.tensors = [self.tensor(t, lambda u, w=f"tensor {t.name!r}'s quantization": idx(u, w)) for t in sg.tensors]
        raw.inputs = [idx(t, "input") for t in sg.inputs]
        raw.outputs = [idx(t, "output") for t in sg.outputs]
        raw.operators = [self.operator(op, lambda t, w=f"{op.name} operator": idx(t, w)) for op in sg.operators]
        raw.name = _encode(sg.name)
        raw.debugMetadataIndex = sg.debug_metadata_index
        self.tensor_index[si] = idx
        return raw

    def tensor(self, t: Tensor, idx: Any) -> Any:
        raw = fb.TensorT()
        raw.name = _encode(t.name)
        raw.shape = [int(d) for d in t.shape]
        raw.type = t.dtype
        raw.shapeSignature = None if t.shape_signature is None else [int(d) for d in t.shape_signature]
        raw.buffer = 0 if t.data is None else self.constant_buffer(t.data)
        raw.quantization = _quantization(t.quantization, idx)
        raw.isVariable = t.is_variable
        raw.hasRank = t.has_rank
        raw.sparsity = t.sparsity
        raw.variantTensors = t.variant_tensors
        raw.externalBuffer = t.external_buffer
        return raw

    def operator(self, op: Operator, idx: Any) -> Any:
        raw = fb.OperatorT()
        raw.opcodeIndex = self.opcodes.setdefault(op.opcode, len(self.opcodes))
        raw.inputs = [idx(t) for t in op.inputs]
        if None in op.outputs:
            raise ModelError(f"{op.name} operator has a missing output")
        raw.outputs = [idx(t) for t in op.outputs]
        raw.builtinOptionsType = op.options_type
        raw.builtinOptions = op.options
        raw.builtinOptions2Type = op.options2_type
        raw.builtinOptions2 = op.options2
        raw.customOptions = None if op.custom_options is None else np.frombuffer(op.custom_options, np.uint8)
        raw.customOptionsFormat = op.custom_options_format
        raw.mutatingVariableInputs = op.mutating_variable_inputs
        raw.intermediates = [idx(t) for t in op.intermediates] or None
        raw.debugMetadataIndex = op.debug_metadata_index
        return raw

    def signature(self, sig: Any) -> Any:
        idx = self.tensor_index[sig.subgraph_index]
        raw = fb.SignatureDefT()
        raw.signatureKey = _encode(sig.key)
        raw.subgraphIndex = sig.subgraph_index
        raw.inputs = [_tensor_map(name, idx(t, "signature")) for name, t in sig.inputs.items()]
        raw.outputs = [_tensor_map(name, idx(t, "signature")) for name, t in sig.outputs.items()]
        return raw


def _encode(text: str | None) -> bytes | None:
    """Encodes a string field; names read with undecodable bytes get those bytes back."""
    return None if text is None else text.encode("utf-8", "surrogateescape")


def _opcode(code: OpCode) -> Any:
    raw = fb.OperatorCodeT()
    raw.builtinCode = code.builtin
    raw.deprecatedBuiltinCode = min(code.builtin, schema.PLACEHOLDER_FOR_GREATER_OP_CODES)
    raw.customCode = _encode(code.custom_code)
    raw.version = code.version
    return raw


def _quantization(q: Quantization | None, idx: Any) -> Any:
    if q is None:
        return None
    raw = fb.QuantizationParametersT()
    raw.scale = None if q.scale is None else np.asarray(q.scale, np.float32)
    raw.zeroPoint = None if q.zero_point is None else np.asarray(q.zero_point, np.int64)
    raw.min = None if q.min is None else np.asarray(q.min, np.float32)
    raw.max = None if q.max is None else np.asarray(q.max, np.float32)
    raw.quantizedDimension = q.quantized_dimension
    raw.detailsType = q.details_type
    raw.details = q.details
    if q.blockwise is not None:
        b = q.blockwise
        raw.detailsType, raw.details = fb.QuantizationDetails.BlockwiseQuantization, fb.BlockwiseQuantizationT()
        raw.details.scales, raw.details.zeroPoints = idx(b.scales), idx(b.zero_points)
        raw.details.blockSize = b.block_size
        raw.details.blockShape = b.block_shape
    return raw


def _metadata(name: str, buffer: int) -> Any:
    raw = fb.MetadataT()
    raw.name = _encode(name)
    raw.buffer = buffer
    return raw


def _tensor_map(name: str, index: int) -> Any:
    raw = fb.TensorMapT()
    raw.name = _encode(name)
    raw.tensorIndex = index
    return raw
