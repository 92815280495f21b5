"""The TFLite flatbuffer schema, and the name tables derived from it.

The generated schema module ships with LiteRT (`ai_edge_litert.schema_py_generated`); we use it
rather than a copy of our own so the project reads exactly the schema the runtime it tests against
understands. Everything else in the project asks this module for names, dtypes and option classes,
so there is one place that knows how the schema spells things.
"""

from __future__ import annotations

import re

import numpy as np

# `tflite_runtime` has no schema module, so the schema always comes from ai-edge-litert; only the
# interpreter falls back to `tflite_runtime` (see runtime.py). The module is pure Python and
# imports fine beside numpy 1.x too.
try:
    from ai_edge_litert import schema_py_generated as fb
except ImportError as exc:  # pragma: no cover
    raise ImportError(
        "tflite_tools needs the TFLite flatbuffer schema from ai-edge-litert (pip install ai-edge-litert)"
    ) from exc

FILE_IDENTIFIER = b"TFL3"
SCHEMA_VERSION = 3


def _enum_names(enum_class: type) -> dict[int, str]:
    """Maps the values of a generated flatbuffer enum class to their names."""
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)}


BUILTIN_NAMES: dict[int, str] = _enum_names(fb.BuiltinOperator)
BUILTIN_CODES: dict[str, int] = {name: code for code, name in BUILTIN_NAMES.items()}
TENSOR_TYPE_NAMES: dict[int, str] = _enum_names(fb.TensorType)
TENSOR_TYPE_CODES: dict[str, int] = {name: code for code, name in TENSOR_TYPE_NAMES.items()}
ACTIVATION_NAMES: dict[int, str] = _enum_names(fb.ActivationFunctionType)
OPTIONS_NAMES: dict[int, str] = _enum_names(fb.BuiltinOptions)
OPTIONS2_NAMES: dict[int, str] = _enum_names(fb.BuiltinOptions2)

# Codes below this are stored twice: `deprecated_builtin_code` (int8) must equal `builtin_code`,
# or old runtimes read a different op.
PLACEHOLDER_FOR_GREATER_OP_CODES = fb.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES


def _numpy_dtypes() -> dict[int, np.dtype]:
    types = {
        "FLOAT32": np.float32, "FLOAT16": np.float16, "FLOAT64": np.float64,
        "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
        "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
        "BOOL": np.bool_, "COMPLEX64": np.complex64, "COMPLEX128": np.complex128,
    }
    try:  # bfloat16 comes with ml_dtypes, a dependency of ai-edge-litert
        import ml_dtypes

        types["BFLOAT16"] = ml_dtypes.bfloat16
    except ImportError:  # pragma: no cover
        pass
    return {TENSOR_TYPE_CODES[name]: np.dtype(t) for name, t in types.items() if name in TENSOR_TYPE_CODES}


# Tensor types whose elements map one-to-one onto a numpy dtype. The rest (STRING, INT4, RESOURCE,
# VARIANT, ...) keep their constant data as raw bytes.
NUMPY_DTYPES: dict[int, np.dtype] = _numpy_dtypes()
TENSOR_TYPE_OF_DTYPE: dict[np.dtype, int] = {dt: code for code, dt in NUMPY_DTYPES.items()}

# Sub-byte types: bits per element, for size accounting.
_SUB_BYTE_BITS = {"INT4": 4, "UINT4": 4, "INT2": 2}


def unpack_int4(raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """INT4 constant data (two elements a byte, the first in the low nibble, as TFLite packs
    them) as a signed int8 array of `shape`."""
    count = int(np.prod(shape, dtype=np.int64))
    packed = np.asarray(raw, np.uint8).reshape(-1)
    nibbles = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(-1)[:count].astype(np.int8)
    return np.where(nibbles > 7, nibbles - 16, nibbles).astype(np.int8).reshape(shape)


def pack_int4(values: np.ndarray) -> np.ndarray:
    """Int8 values in [-8, 7] as TFLite stores an INT4 constant: two a byte, the first in the low nibble."""
    flat = np.asarray(values, np.int8).reshape(-1)
    if flat.size and (flat.min() < -8 or flat.max() > 7):
        raise ValueError("INT4 values lie in [-8, 7]")
    nibbles = np.append(flat, np.int8(0)) if flat.size % 2 else flat
    nibbles = nibbles.astype(np.uint8) & 0x0F
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def tensor_type_name(code: int) -> str:
    """The schema's name for a TensorType code (`FLOAT32`), or `TYPE_<n>` for an unknown code."""
    return TENSOR_TYPE_NAMES.get(code, f"TYPE_{code}")


def element_bits(code: int) -> int | None:
    """Bits per element of a TensorType, or None where elements have no fixed size (STRING)."""
    if code in NUMPY_DTYPES:
        return NUMPY_DTYPES[code].itemsize * 8
    return _SUB_BYTE_BITS.get(tensor_type_name(code))


def builtin_name(code: int) -> str:
    """The schema's name for a builtin operator code (`CONV_2D`), or `BUILTIN_<n>` if unknown."""
    return BUILTIN_NAMES.get(code, f"BUILTIN_{code}")


def builtin_code(name: str) -> int:
    """The builtin operator code for a schema name; raises KeyError with the name if unknown."""
    try:
        return BUILTIN_CODES[name.upper()]
    except KeyError:
        raise KeyError(f"unknown TFLite builtin operator {name!r}") from None


# Builtins whose options table is not simply `<CamelCaseName>Options`.
_OPTIONS_OVERRIDES = {
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "PADV2": "PadV2Options",
    "CONV_2D": "Conv2DOptions",
    "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "CONV_3D": "Conv3DOptions",
    "CONV_3D_TRANSPOSE": "Conv3DOptions",
    "BATCH_MATMUL": "BatchMatMulOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions",
    "L2_NORMALIZATION": "L2NormOptions",
    "LOCAL_RESPONSE_NORMALIZATION": "LocalResponseNormalizationOptions",
    "SVDF": "SVDFOptions",
    "RNN": "RNNOptions",
    "LSTM": "LSTMOptions",
    "LSH_PROJECTION": "LSHProjectionOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    "BATCH_TO_SPACE_ND": "BatchToSpaceNDOptions",
    "SPACE_TO_BATCH_ND": "SpaceToBatchNDOptions",
    "TOPK_V2": "TopKV2Options",
    "NON_MAX_SUPPRESSION_V4": "NonMaxSuppressionV4Options",
    "NON_MAX_SUPPRESSION_V5": "NonMaxSuppressionV5Options",
    "ATAN2": "ATan2Options",
    "RFFT2D": "Rfft2dOptions",
}


def options_name(op_name: str) -> str | None:
    """The BuiltinOptions union member that carries `op_name`'s options, or None if it has none."""
    name = _OPTIONS_OVERRIDES.get(op_name)
    if name is None:
        name = "".join(part.capitalize() for part in op_name.split("_")) + "Options"
    return name if hasattr(fb.BuiltinOptions, name) else None


# Enum-typed option fields, so the builder can take `padding="SAME"` instead of `padding=0`.
OPTION_ENUMS: dict[str, type] = {
    "padding": fb.Padding,
    "fusedActivationFunction": fb.ActivationFunctionType,
    "mode": fb.MirrorPadMode,
    "weightsFormat": fb.FullyConnectedOptionsWeightsFormat,
    "inDataType": fb.TensorType,
    "outDataType": fb.TensorType,
    "outputType": fb.TensorType,
    "outType": fb.TensorType,
    "idxOutType": fb.TensorType,
    "quantizedBiasType": fb.TensorType,
}


def snake_to_camel(name: str) -> str:
    """`fused_activation_function` -> `fusedActivationFunction` (the object API's field names)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def camel_to_snake(name: str) -> str:
    """`fusedActivationFunction` -> `fused_activation_function`."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
