"""What a kernel, or a bundle of kernels, was built for, as one hash.

One canonical form of a list of operators serves every identity the project keeps:

- a block's **kernel identity** (`block_identity`): kernels are named, shared between identical
  blocks and cached on disk under it;
- the planner's **block signature**: the same form without bound constants (below), which only
  the lowering knows;
- the **model fingerprint** (`subgraph_fingerprint`) that `tflite_tools fuse` stores in the fused
  model's metadata and in the delegate library; the delegate declines a model whose fingerprint
  differs.

The form covers operators (builtin and custom codes, versions, options, options2, custom options,
which tensors they read and write, in order) and tensors (types, shapes, which are constants, the
scales and zero points of quantized ones, which int8 kernels compile in). Constant *values* enter
only where they are **bound**: read while a kernel is built (a SLICE's begin, a PAD's amounts, a
TRANSPOSE's permutation, a property of int8 weights), as the lowering records them
(halide_gen.lower.registry.OpContext.const). Weights a kernel takes as arguments stay out, so
repeated layers share one kernel and the delegate reads them from the model at run time.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .ir import Operator, Subgraph, Tensor

METADATA_NAME = "dnnfusion.fingerprint"  # delegate/include/dnnfusion/bundle.h: kFingerprintMetadata
FORM_VERSION = 3  # bump when the canonical form changes

# (operator position, input index) -> the bound value's text (constant_text, or a property).
Bound = Mapping[tuple[int, int], str]


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


def _tensor_key(t: Tensor, shapes: bool = True) -> list:
    """What a kernel depends on of a tensor besides its value (quantization only where there is some;
    the shape unless `shapes` is False)."""
    key = [t.dtype, list(t.shape) if shapes else None, t.is_constant]
    q = t.quantization
    if q is not None and q.scale is not None and len(q.scale):
        zero_points = [] if q.zero_point is None else np.asarray(q.zero_point).tolist()
        key.append([np.asarray(q.scale, np.float32).tolist(), zero_points, q.quantized_dimension])
    if q is not None and q.blockwise is not None:  # its scales reach the kernel as an argument
        b = q.blockwise
        key.append(["blockwise", b.block_size, [_tensor_key(u, shapes) for u in q.tensors]])
    return key


def constant_text(value: np.ndarray) -> str:
    """A bound constant's value as identities record it: type, shape and a digest of its bytes."""
    value = np.ascontiguousarray(value)
    return f"{value.dtype.str}{list(value.shape)}:{hashlib.sha256(value.tobytes()).hexdigest()[:32]}"


def _digest(operators: Sequence[Operator], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
            name_of: Callable[[Tensor], Any], bound: Bound, shapes: bool = True) -> str:
    """The hex SHA-256 of the canonical form: each operator with its operands (named by `name_of`,
    each with its tensor key and, where bound, its value), then the inputs and outputs."""

    def operand(n: int, i: int, t: Tensor | None) -> Any:
        if t is None:
            return None
        return [name_of(t), _tensor_key(t, shapes), bound.get((n, i))]

    form = {
        "form": FORM_VERSION,
        "operators": [[op.opcode.builtin, op.opcode.custom_code, op.opcode.version,
                       [operand(n, i, t) for i, t in enumerate(op.inputs)],
                       [operand(n, -1, t) for t in op.outputs],
                       _canonical(op.options), _canonical(op.options2), _canonical(op.custom_options)]
                      for n, op in enumerate(operators)],
        "inputs": [name_of(t) for t in inputs],
        "outputs": [name_of(t) for t in outputs],
    }
    return hashlib.sha256(json.dumps(form, sort_keys=True).encode()).hexdigest()


def block_identity(operators: Sequence[Operator], outputs: Sequence[Tensor], bound: Bound | None = None) -> str:
    """The identity of a kernel computing `outputs` (in order) from `operators` (in execution
    order): tensors are named by first use, so identical blocks anywhere in any model agree.
    `bound` keys an operator's position in `operators`."""
    names: dict[int, int] = {}

    def name_of(t: Tensor) -> int:
        return names.setdefault(id(t), len(names))

    return _digest(operators, [], outputs, name_of, bound or {})


def subgraph_fingerprint(sg: Subgraph, bound: Bound | None = None, shapes: bool = True) -> str:
    """The fingerprint of a subgraph and the kernels built for it: tensors named by their index
    (as the writer saves them and the delegate claims them), `bound` keyed by node index. Without
    `shapes`, what two subgraphs computing the same at other sizes share (a prefill signature per
    length): a kernel of one runs on the other wherever the shapes it was compiled for agree."""
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    return _digest(sg.operators, sg.inputs, sg.outputs, lambda t: index[id(t)], bound or {}, shapes)


def nodes_fingerprint(sg: Subgraph, nodes: Sequence[int], bound: Bound | None = None, shapes: bool = True) -> str:
    """The fingerprint of some of a subgraph's nodes (in the order given), tensors named by their
    index in the subgraph, `bound` keyed by position in `nodes`: what a kernel of these nodes
    computes, where the delegate finds them."""
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    return _digest([sg.operators[n] for n in nodes], [], [], lambda t: index[id(t)], bound or {}, shapes)


def model_fingerprint(fingerprints: Sequence[str]) -> str:
    """The fingerprint of a model from its subgraphs' (in order): a one-subgraph model's is its
    subgraph's."""
    if len(fingerprints) == 1:
        return fingerprints[0]
    return hashlib.sha256("\n".join(fingerprints).encode()).hexdigest()


def bound_values(sg: Subgraph, keys: Sequence[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The values a subgraph holds at bound keys (node index, input index), as constant_text
    records them ("computed" where the input is not a constant there; None where it is absent)."""
    values: dict[tuple[int, int], str] = {}
    for n, i in keys:
        op = sg.operators[n] if n < len(sg.operators) else None
        t = op.inputs[i] if op is not None and i < len(op.inputs) else None
        values[(n, i)] = "absent" if t is None else constant_text(t.data) if t.is_constant else "computed"
    return values
