"""Block signatures: a stable name for "these ops, with these options, shapes and types".

A signature names a block's kernel and keys the cost cache (and, later, the compile cache), so
identical blocks — repeated transformer layers — are measured and compiled once. It depends on
structure only: tensor names and constant values do not enter it (weights reach kernels as
inputs), quantization parameters and options do.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

import numpy as np

from tflite_tools.model.ir import Tensor

from .ecg import ECG

SIGNATURE_VERSION = 2  # bump when the canonical form below changes


def _options_text(options: Any) -> str:
    if options is None:
        return ""
    items = []
    for key, value in sorted(vars(options).items()):
        if isinstance(value, np.ndarray):
            value = value.tolist()
        items.append(f"{key}={value!r}")
    return type(options).__name__ + "{" + ",".join(items) + "}"


def _tensor_text(t: Tensor) -> str:
    text = f"{t.type_name}{list(t.shape)}"
    q = t.quantization
    if q is not None and q.scale is not None:
        zp = [] if q.zero_point is None else q.zero_point.tolist()
        text += f"q({q.scale.tolist()},{zp},{q.quantized_dimension})"
    return text


def canonical_form(ecg: ECG, ops: Iterable[int]) -> str:
    """The text a block's signature hashes: each op with its operands named by position, then
    which results leave the block."""
    ops = sorted(ops)
    names: dict[int, str] = {}
    lines = [f"v{SIGNATURE_VERSION}"]
    counts = {"in": 0, "c": 0, "t": 0}

    def ref(t: Tensor | None) -> str:
        if t is None:
            return "-"
        if id(t) not in names:
            kind = "c" if t.is_constant else "in"
            names[id(t)] = f"{kind}{counts[kind]}:{_tensor_text(t)}"
            counts[kind] += 1
        return names[id(t)]

    for i in sorted(ops):
        op = ecg.nodes[i].op
        ins = ",".join(ref(t) for t in op.inputs)
        outs = []
        for t in op.outputs:
            names[id(t)] = f"t{counts['t']}:{_tensor_text(t)}"
            counts["t"] += 1
            outs.append(names[id(t)])
        lines.append(f"{op.name}/v{op.opcode.version}({ins})->{','.join(outs)} {_options_text(op.options)}")
    # Which results leave the block decides the kernel's outputs: the same ops with another
    # escaping tensor are another kernel.
    members = set(ops)
    escaping = [names[id(t)].split(":")[0] for i in sorted(members) for t in ecg.nodes[i].op.outputs
                if not ecg.ir_removable(t, members)]
    lines.append("out:" + ",".join(escaping))
    return "\n".join(lines)


def block_signature(ecg: ECG, ops: Iterable[int]) -> str:
    """A short hex digest of the block's canonical form."""
    return hashlib.sha256(canonical_form(ecg, ops).encode()).hexdigest()[:20]
