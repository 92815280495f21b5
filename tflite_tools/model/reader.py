"""Reading a `.tflite` flatbuffer into the graph IR, checking everything an index can get wrong.

The generated object API does the decoding; this module turns its index-linked objects into the
IR, and turns every way a file can be broken into one `ModelError` naming the problem. Constant
data stays a view into the file's bytes: nothing is copied.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np

from . import schema
from .errors import ModelError
from .ir import BlockwiseQuantization, Model, OpCode, Operator, Quantization, Signature, Subgraph, Tensor

fb = schema.fb


def read_file(path: str | os.PathLike) -> bytes:
    """The bytes of a model file. A missing path, a directory, an empty file or anything but a
    regular file (a device such as /dev/zero, a FIFO, a socket) is a ModelError; no more than the
    file's size is ever read."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if p.is_dir():
        raise ModelError(f"{p}: is a directory, not a .tflite file")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer before we can refuse it.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ModelError(f"{p}: cannot read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelError(f"{p}: not a regular file (a device, pipe or socket), so not a .tflite file")
        try:
            data = handle.read(info.st_size)
        except OSError as exc:
            raise ModelError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if not data:
        raise ModelError(f"{p}: file is empty")
    return data


def load(path: str | os.PathLike) -> Model:
    """Loads a `.tflite` file into the graph IR. Raises ModelError for anything but a valid model."""
    return parse(read_file(path), source=str(path))


def parse(data: bytes | bytearray | memoryview, source: str = "<bytes>") -> Model:
    """Parses flatbuffer bytes into the graph IR. Raises ModelError for anything but a valid model.

    Constant tensors become read-only numpy views into `data`, so `data` stays alive as long as
    the model does.
    """
    buf = bytes(data) if not isinstance(data, bytes) else data
    _check_header(buf, source)
    try:
        root = flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0)
        raw = fb.ModelT.InitFromBuf(buf, root)
    except Exception as exc:  # the generated decoder fails in many ways on bad offsets
        raise ModelError(f"{source}: corrupt or truncated TFLite flatbuffer ({_describe(exc)})") from None
    try:
        return _Converter(buf, raw, source).model()
    except ModelError:
        raise
    except Exception as exc:  # a structurally valid flatbuffer whose fields make no sense
        raise ModelError(f"{source}: malformed TFLite model ({_describe(exc)})") from None


def _describe(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _check_header(buf: bytes, source: str) -> None:
    if len(buf) < 8:
        raise ModelError(f"{source}: too small to be a TFLite model ({len(buf)} bytes)")
    ident = buf[4:8]
    if ident != schema.FILE_IDENTIFIER:
        raise ModelError(
            f"{source}: not a TFLite model (file identifier {ident!r}, expected {schema.FILE_IDENTIFIER!r})"
        )
    root = int.from_bytes(buf[0:4], "little")
    if not 8 <= root < len(buf) - 4:
        raise ModelError(f"{source}: corrupt or truncated TFLite flatbuffer (root offset {root} out of range)")


def _text(value: bytes | str | None) -> str | None:
    """Decodes a flatbuffer string; undecodable bytes survive a round trip as surrogates."""
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "surrogateescape")


def _ints(values: Any) -> list[int]:
    return [] if values is None else [int(v) for v in values]


# No tensor can be larger than this (2^48 bytes, 256 TiB: past any address space a phone or a
# server maps); a larger shape is corruption, and its byte count would overflow 64-bit arithmetic.
MAX_TENSOR_BYTES = 2**48


class _Converter:
    """Turns one decoded `ModelT` into the IR, checking every index on the way."""

    def __init__(self, buf: bytes, raw: Any, source: str):
        self.buf = buf
        self.raw = raw
        self.source = source
        self.buffers = raw.buffers or []

    def fail(self, where: str, message: str) -> ModelError:
        return ModelError(f"{self.source}: {where}: {message}")

    def model(self) -> Model:
        raw = self.raw
        if raw.version != schema.SCHEMA_VERSION:
            raise ModelError(
                f"{self.source}: unsupported TFLite schema version {raw.version} "
                f"(expected {schema.SCHEMA_VERSION}); is this a TFLite model?"
            )
        if not raw.subgraphs:
            raise ModelError(f"{self.source}: model has no subgraphs")
        self.opcodes = [self.opcode(i, c) for i, c in enumerate(raw.operatorCodes or [])]
        subgraphs = [self.subgraph(i, sg) for i, sg in enumerate(raw.subgraphs)]
        metadata, legacy = self.metadata()
        model = Model(
            subgraphs=subgraphs,
            metadata=metadata,
            description=_text(raw.description),
            version=raw.version,
            external_buffer_groups=raw.externalBufferGroups,
            external_buffers=raw.externalBuffers,
            legacy_metadata_buffer=legacy,
        )
        model.signatures = [self.signature(i, s, subgraphs) for i, s in enumerate(raw.signatureDefs or [])]
        self.check_subgraph_references(model)
        return model

    def opcode(self, index: int, code: Any) -> OpCode:
        # Models written before schema v3a only set the int8 deprecated field.
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        if builtin < 0:
            raise self.fail(f"operator code {index}", f"negative builtin code {builtin}")
        if builtin not in schema.BUILTIN_NAMES:
            raise self.fail(f"operator code {index}", f"unknown builtin operator code {builtin} (this schema knows "
                            f"0 to {max(schema.BUILTIN_NAMES)}; upgrade ai-edge-litert if the model is newer)")
        return OpCode(builtin, _text(code.customCode), int(code.version))

    def buffer_bytes(self, index: int, where: str) -> np.ndarray | None:
        """The bytes of buffer `index` as a uint8 view, or None when it is empty."""
        if not 0 <= index < len(self.buffers):
            raise self.fail(where, f"refers to buffer {index}, but the model has {len(self.buffers)}")
        b = self.buffers[index]
        if b.offset > 1:  # data stored after the flatbuffer (models over 2 GiB)
            end = b.offset + b.size
            if end > len(self.buf):
                raise self.fail(where, f"buffer {index} lies past the end of the file (truncated?)")
            data = np.frombuffer(self.buf, np.uint8, count=b.size, offset=b.offset)
        else:
            data = b.data
        if data is None or len(data) == 0:
            return None
        return data

    def subgraph(self, si: int, raw: Any) -> Subgraph:
        where = f"subgraph {si}"
        tensors = [self.tensor(f"{where} tensor {ti}", t) for ti, t in enumerate(raw.tensors or [])]

        def ref(index: int, what: str, optional: bool = False) -> Tensor | None:
            if optional and index == -1:
                return None
            if not 0 <= index < len(tensors):
                raise self.fail(what, f"refers to tensor {index}, but the subgraph has {len(tensors)}")
            return tensors[index]

        for ti, t in enumerate(tensors):
            self.resolve_blockwise(f"{where} tensor {ti}", t, ref)
        operators = []
        for oi, op in enumerate(raw.operators or []):
            operators.append(self.operator(f"{where} operator {oi}", op, ref))
        self.check_order(where, operators)
        return Subgraph(
            tensors=tensors,
            operators=operators,
            inputs=[ref(i, f"{where} input") for i in _ints(raw.inputs)],
            outputs=[ref(i, f"{where} output") for i in _ints(raw.outputs)],
            name=_text(raw.name),
            debug_metadata_index=int(raw.debugMetadataIndex),
        )

    def check_order(self, where: str, operators: list[Operator]) -> None:
        """TFLite runs operators in the order stored: each tensor is written by one operator at
        most, and read only after that (an op reading its own output, or a cycle, is no graph)."""
        writer: dict[int, int] = {}
        for oi, op in enumerate(operators):
            for t in op.outputs:
                if id(t) in writer:
                    raise self.fail(f"{where} operator {oi} ({op.name})",
                                    f"writes tensor {t.name!r}, already written by operator {writer[id(t)]}")
                writer[id(t)] = oi
        for oi, op in enumerate(operators):
            for t in op.inputs:
                if t is not None and writer.get(id(t), -1) >= oi:
                    raise self.fail(f"{where} operator {oi} ({op.name})",
                                    f"reads tensor {t.name!r} before operator {writer[id(t)]} writes it "
                                    "(a cycle, or operators out of order)")

    def tensor(self, where: str, raw: Any) -> Tensor:
        name = _text(raw.name) or ""
        where = f"{where} ({name!r})" if name else where
        shape = tuple(_ints(raw.shape))
        if any(d < 0 for d in shape):
            raise self.fail(where, f"negative dimension in shape {list(shape)}")
        if math.prod(shape) * 16 > MAX_TENSOR_BYTES:  # 16: the widest element (COMPLEX128)
            raise self.fail(where, f"shape {list(shape)} is too large for any machine to hold")
        signature = tuple(_ints(raw.shapeSignature)) if raw.shapeSignature is not None else None
        if signature is not None and len(signature) != len(shape):
            raise self.fail(where, f"shape signature {list(signature)} does not match shape {list(shape)}")
        dtype = int(raw.type)
        if dtype not in schema.TENSOR_TYPE_NAMES:
            raise self.fail(where, f"unknown tensor type {dtype}")
        tensor = Tensor(
            name=name,
            shape=shape,
            dtype=dtype,
            shape_signature=signature,
            quantization=self.quantization(raw.quantization),
            is_variable=bool(raw.isVariable),
            has_rank=bool(raw.hasRank),
            sparsity=raw.sparsity,
            variant_tensors=raw.variantTensors,
            external_buffer=int(raw.externalBuffer),
        )
        data = self.buffer_bytes(int(raw.buffer), where)
        if data is not None:
            tensor.data = self.typed(where, tensor, data)
        return tensor

    def typed(self, where: str, tensor: Tensor, data: np.ndarray) -> np.ndarray:
        """Reinterprets a constant's bytes as its dtype and shape, checking the length."""
        dtype = tensor.numpy_dtype
        if dtype is None or tensor.sparsity is not None:
            bits = schema.element_bits(tensor.dtype)
            if tensor.sparsity is None and bits is not None:
                needed = (tensor.num_elements * bits + 7) // 8
                if len(data) != needed:
                    raise self.fail(where, f"constant holds {len(data)} bytes, shape needs {needed}")
            return data
        needed = tensor.num_elements * dtype.itemsize
        if len(data) != needed:
            raise self.fail(
                where,
                f"constant holds {len(data)} bytes, but {tensor.type_name}{list(tensor.shape)} needs {needed}",
            )
        return data.view(dtype).reshape(tensor.shape)

    @staticmethod
    def quantization(raw: Any) -> Quantization | None:
        if raw is None:
            return None
        q = Quantization(
            scale=None if raw.scale is None else np.asarray(raw.scale, np.float32),
            zero_point=None if raw.zeroPoint is None else np.asarray(raw.zeroPoint, np.int64),
            quantized_dimension=int(raw.quantizedDimension),
            min=None if raw.min is None else np.asarray(raw.min, np.float32),
            max=None if raw.max is None else np.asarray(raw.max, np.float32),
            details_type=int(raw.detailsType),
            details=raw.details,
        )
        return None if q.is_empty() and q.quantized_dimension == 0 else q

    def resolve_blockwise(self, where: str, t: Tensor, ref: Any) -> None:
        """A blockwise quantization's scale and zero-point tensors, named by index in the file, as
        references (ir.BlockwiseQuantization)."""
        q = t.quantization
        blockwise = getattr(fb.QuantizationDetails, "BlockwiseQuantization", None)  # absent from older schemas
        if q is None or blockwise is None or q.details_type != blockwise or q.details is None:
            return
        d = q.details
        if int(d.blockSize) <= 0:
            raise self.fail(where, f"blockwise quantization with a block size of {int(d.blockSize)}")
        q.blockwise = BlockwiseQuantization(ref(int(d.scales), f"{where} block scales"),
                                            ref(int(d.zeroPoints), f"{where} block zero points", optional=True),
                                            int(d.blockSize), getattr(d, "blockShape", None))
        q.details_type, q.details = 0, None

    def operator(self, where: str, raw: Any, ref: Any) -> Operator:
        index = int(raw.opcodeIndex)
        if not 0 <= index < len(self.opcodes):
            raise self.fail(where, f"refers to operator code {index}, but the model has {len(self.opcodes)}")
        opcode = self.opcodes[index]
        where = f"{where} ({opcode.name})"
        for kind, code, names, value in (
            ("builtin options", raw.builtinOptionsType, schema.OPTIONS_NAMES, raw.builtinOptions),
            ("builtin options 2", raw.builtinOptions2Type, schema.OPTIONS2_NAMES, raw.builtinOptions2),
        ):
            if code and code not in names:
                raise self.fail(where, f"{kind} type {code} is unknown to this schema; upgrade ai-edge-litert")
        custom = raw.customOptions
        if raw.largeCustomOptionsOffset > 1:
            start, size = int(raw.largeCustomOptionsOffset), int(raw.largeCustomOptionsSize)
            if start + size > len(self.buf):
                raise self.fail(where, "custom options lie past the end of the file (truncated?)")
            custom = self.buf[start : start + size]
        return Operator(
            opcode=opcode,
            inputs=[ref(i, f"{where} input", optional=True) for i in _ints(raw.inputs)],
            outputs=[ref(i, f"{where} output") for i in _ints(raw.outputs)],
            options_type=int(raw.builtinOptionsType),
            options=raw.builtinOptions,
            options2_type=int(raw.builtinOptions2Type),
            options2=raw.builtinOptions2,
            custom_options=None if custom is None else bytes(custom),
            custom_options_format=int(raw.customOptionsFormat),
            mutating_variable_inputs=None
            if raw.mutatingVariableInputs is None
            else [bool(v) for v in raw.mutatingVariableInputs],
            intermediates=[ref(i, f"{where} intermediate") for i in _ints(raw.intermediates)],
            debug_metadata_index=int(raw.debugMetadataIndex),
        )

    def metadata(self) -> tuple[list[tuple[str, bytes]], list[int] | None]:
        entries = []
        by_buffer: dict[int, int] = {}
        for mi, m in enumerate(self.raw.metadata or []):
            data = self.buffer_bytes(int(m.buffer), f"metadata {mi}")
            by_buffer[int(m.buffer)] = mi
            entries.append((_text(m.name) or "", b"" if data is None else bytes(data)))
        legacy = None
        if self.raw.metadataBuffer is not None:
            # The deprecated field lists buffer indices; keep it as indices into `metadata`.
            legacy = [by_buffer[b] for b in _ints(self.raw.metadataBuffer) if b in by_buffer]
        return entries, legacy

    def signature(self, index: int, raw: Any, subgraphs: list[Subgraph]) -> Signature:
        key = _text(raw.signatureKey) or ""
        where = f"signature {index} ({key!r})"
        si = int(raw.subgraphIndex)
        if not 0 <= si < len(subgraphs):
            raise self.fail(where, f"refers to subgraph {si}, but the model has {len(subgraphs)}")
        tensors = subgraphs[si].tensors

        def bind(maps: Any) -> dict[str, Tensor]:
            bound = {}
            for m in maps or []:
                ti = int(m.tensorIndex)
                if not 0 <= ti < len(tensors):
                    raise self.fail(where, f"refers to tensor {ti}, but subgraph {si} has {len(tensors)}")
                bound[_text(m.name) or ""] = tensors[ti]
            return bound

        return Signature(key=key, subgraph_index=si, inputs=bind(raw.inputs), outputs=bind(raw.outputs))

    def check_subgraph_references(self, model: Model) -> None:
        """WHILE / IF / CALL_ONCE options name subgraphs by index; each must exist."""
        count = len(model.subgraphs)
        for si, op in model.operators():
            for options in (op.options, op.options2):
                for attr, value in vars(options).items() if options is not None else ():
                    if attr.endswith("SubgraphIndex") and not 0 <= int(value) < count:
                        raise self.fail(
                            f"subgraph {si} {op.name}", f"{attr} {value} is out of range ({count} subgraphs)"
                        )
