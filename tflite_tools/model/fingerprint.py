"""A model's structure as one hash: what a kernel bundle was built for.

The fingerprint covers what the delegate's kernels depend on — operators (codes, options, which
tensors they read and write, in order) and tensors (types, shapes, which are constants, and the
scales and zero points of quantized ones, which int8 kernels compile in) — and not the weights,
which the delegate reads from the model at run time. `tflite_tools fuse` stores
it in the fused model's metadata and in the delegate library; the delegate declines a model whose
fingerprint differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from .ir import Subgraph

METADATA_NAME = "dnnfusion.fingerprint"  # delegate/include/dnnfusion/bundle.h: kFingerprintMetadata


def _canonical(value: Any) -> Any:
    """Options objects as plain JSON values, attributes sorted."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return {type(value).__name__: {k: _canonical(v) for k, v in sorted(vars(value).items())}}


def _tensor_key(t) -> list:
    """What a kernel depends on of a tensor (quantization only where there is some, so float
    models keep the fingerprints they had)."""
    key = [t.dtype, list(t.shape), t.is_constant]
    q = t.quantization
    if q is not None and q.scale is not None and len(q.scale):
        zero_points = [] if q.zero_point is None else np.asarray(q.zero_point).tolist()
        key.append([np.asarray(q.scale, np.float32).tolist(), zero_points, q.quantized_dimension])
    return key


def subgraph_fingerprint(sg: Subgraph) -> str:
    """The hex SHA-256 of the subgraph's structure (tensor indices are list positions, as the
    writer saves them)."""
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    text = json.dumps({
        "tensors": [_tensor_key(t) for t in sg.tensors],
        "operators": [[op.opcode.builtin, op.opcode.custom_code,
                       [index[id(t)] if t is not None else -1 for t in op.inputs],
                       [index[id(t)] for t in op.outputs],
                       _canonical(op.options), _canonical(op.options2), _canonical(op.custom_options)]
                      for op in sg.operators],
        "inputs": [index[id(t)] for t in sg.inputs],
        "outputs": [index[id(t)] for t in sg.outputs],
    }, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
