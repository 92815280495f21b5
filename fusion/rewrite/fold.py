"""Constant folding by asking LiteRT: an op whose inputs are all constants is run once.

Folding through TFLite's own reference kernels (not a numpy re-implementation) makes the folded
constant exactly what the runtime would have computed — including fp16 -> fp32 DEQUANTIZE of
weights and DENSIFY of sparse weights, whose formats we then never have to decode ourselves.

Decoding is folded for the compiler only. A decoded weight is 2x (fp16), 4x (int8) or more
(sparse) the bytes of its stored form, so `restore_decoded` puts the stored constant and its
DEQUANTIZE / DENSIFY nodes back before the model is saved: the delegate runs them once, with
TFLite's kernels, and packs what they decoded (delegate/src/claim.h); TFLite runs them for what the
delegate leaves.
"""

from __future__ import annotations

import numpy as np

from tflite_tools import runtime, serialize
from tflite_tools.model.ir import Model, Operator, Signature, Subgraph, Tensor, with_referenced

from ..mapping import op_info

# Deterministic builtins outside the mapping table that are still worth folding.
EXTRA_FOLDABLE = {"DENSIFY", "SHAPE", "RANGE", "FILL", "ZEROS_LIKE", "ONES_LIKE"}

# A fold must not turn a small constant into a large one (BROADCAST_TO / TILE of a scalar).
MAX_GROWTH = 4
# Except where TFLite materialises the result anyway: DENSIFY writes its dense weights into a
# persistent tensor at Prepare, so folding it costs file size, not memory. A weight sparser than
# 1 in MAX_GROWTH stayed a DENSIFY before and left its conv (and the blocks around it) to TFLite.
GROWTH_UNLIMITED = {"DENSIFY"}

# Ops that only decode a stored constant into the values it stands for: their folded outputs
# remember the node (Tensor.decoded_from), and the saved model keeps the stored form.
DECODERS = {"DEQUANTIZE", "DENSIFY"}


def foldable(op: Operator) -> bool:
    """True for a side-effect-free builtin whose every present input is a constant."""
    if op.opcode.is_custom or not (op_info(op) is not None or op.name in EXTRA_FOLDABLE):
        return False
    present = [t for t in op.inputs if t is not None]
    return bool(present) and all(t.is_constant for t in present) and bool(op.outputs)


def _copy_tensor(t: Tensor) -> Tensor:
    return Tensor(t.name, t.shape, t.dtype, t.shape_signature, t.quantization, t.data, sparsity=t.sparsity)


def evaluate(op: Operator) -> list[np.ndarray] | None:
    """Runs one op on its constant inputs with TFLite's reference kernels.

    Returns the outputs, or None when LiteRT cannot run it (the op then stays as it is).
    """
    inputs = [None if t is None else _copy_tensor(t) for t in op.inputs]
    outputs = [Tensor(t.name, t.shape, t.dtype, quantization=t.quantization) for t in op.outputs]
    clone = Operator(op.opcode, inputs, outputs, op.options_type, op.options, op.options2_type, op.options2,
                     op.custom_options, op.custom_options_format)
    tensors = with_referenced(inputs + outputs)
    graph = Subgraph(tensors=tensors, operators=[clone], inputs=[], outputs=outputs)
    model = Model(subgraphs=[graph], signatures=[Signature("fold", 0, {}, {t.name: t for t in outputs})])
    try:
        interp = runtime.make_interpreter(serialize(model), resolver="reference")
        return runtime.run(interp, [])
    except (RuntimeError, ValueError):
        return None


def fold(op: Operator, graph_outputs: set[int]) -> bool:
    """Replaces `op`'s outputs by constants when it is safe and cheap; True if it did.

    Graph outputs are never made constant (a model should still compute what it returns).
    """
    if not foldable(op) or any(id(t) in graph_outputs for t in op.outputs):
        return False
    in_bytes = sum(t.data.nbytes for t in op.inputs if t is not None)
    out_bytes = sum(t.nbytes for t in op.outputs)
    if op.name not in GROWTH_UNLIMITED and out_bytes > MAX_GROWTH * max(in_bytes, 64):
        return False
    values = evaluate(op)
    if values is None:
        return False
    for t, v in zip(op.outputs, values):
        v = np.ascontiguousarray(v.reshape(t.shape))
        v.flags.writeable = False
        t.data = v
        if op.name in DECODERS:
            t.decoded_from = op
    return True


def restore_decoded(sg: Subgraph) -> int:
    """Gives every decoded constant that an operator still reads its stored form back: the stored
    constant, and the DEQUANTIZE / DENSIFY nodes that decode it (a whole chain: sparse fp16 weights
    are DENSIFY, then DEQUANTIZE), inserted at the front of the operators. The decoded tensors keep
    `decoded_from` and lose their data: they are computed once, as in the original model.

    The delegate runs the decoders of the weights its blocks read itself, with TFLite's own kernels
    (delegate/src/claim.h): XNNPACK, applied after it, would take a DENSIFY whose DEQUANTIZE feeds
    a node it does not run and never write its output.

    Returns how many nodes were inserted: every later node's index moves by that much. Call it
    after the compiler is done with the decoded values and before the graph is fingerprinted.
    """
    decoders: list[Operator] = []
    known = {id(t) for t in sg.tensors}

    def restore(t: Tensor) -> None:
        decoder = t.decoded_from
        for read in decoder.inputs:
            if read is None:
                continue
            if read.decoded_from is not None and read.data is not None:
                restore(read)  # itself decoded: its decoder goes first
            if id(read) not in known:
                known.add(id(read))
                sg.tensors.append(read)
        decoders.append(decoder)
        t.data = None

    for op in list(sg.operators):
        for t in op.inputs:
            if t is not None and t.data is not None and t.decoded_from is not None:
                restore(t)
    sg.operators[:0] = decoders
    return len(decoders)
