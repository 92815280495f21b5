"""Block signatures: the planner's name for "these ops, with these options, shapes and types".

A signature keys the cost cache, so identical blocks (repeated transformer layers) are measured
once. It is the kernel identity's canonical form (tflite_tools.model.fingerprint.block_identity)
without bound constants: which constant values a kernel bakes in, only its lowering knows, so
kernels are named, shared and cached by the identity the lowering computes
(halide_gen.block.BlockKernel.identity), never by this.
"""

from __future__ import annotations

from typing import Iterable

from tflite_tools.model.fingerprint import block_identity

from .ecg import ECG


def block_signature(ecg: ECG, ops: Iterable[int]) -> str:
    """A short hex digest of the block's structure: its ops in order and the results that leave it."""
    members = sorted(ops)
    operators = [ecg.nodes[i].op for i in members]
    # Which results leave the block decides the kernel's outputs: the same ops with another
    # escaping tensor are another kernel.
    outputs = [t for op in operators for t in op.outputs if not ecg.ir_removable(t, set(members))]
    return block_identity(operators, outputs)[:20]
