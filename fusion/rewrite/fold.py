"""Constant folding by asking LiteRT: an op whose inputs are all constants is run once.

Folding through TFLite's own reference kernels (not a numpy re-implementation) makes the folded
constant exactly what the runtime would have computed — including fp16 -> fp32 DEQUANTIZE of
weights and DENSIFY of sparse weights, whose formats we then never have to decode ourselves.

Decoding is folded for the compiler only. A decoded weight is 2x (fp16), 4x (int8) or more
(sparse) the bytes of its stored form, so `restore_decoded` puts the stored constant and its
DEQUANTIZE / DENSIFY node back before the model is saved: TFLite decodes it once, before the
delegate's partition first runs, and the delegate packs what TFLite decoded (delegate/src/partition.cc).
"""

from __future__ import annotations

import numpy as np

from tflite_tools import runtime, serialize
from tflite_tools.model.ir import Model, Operator, Signature, Subgraph, Tensor

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
    tensors = [t for t in inputs if t is not None] + outputs
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
    constant, and the DEQUANTIZE / DENSIFY node that decodes it, inserted at the front of the
    operators. The decoded tensor keeps `decoded_from` and loses its data: TFLite computes it,
    once, as the original model did.

    Only the last decoder of a chain is restored (DENSIFY -> DEQUANTIZE keeps the densified fp16
    weights): XNNPACK, applied after the delegate, takes the first decoder of a chain whose last
    one feeds a node it does not run, and never writes that decoder's output.

    Returns how many nodes were inserted: every later node's index moves by that much. Call it
    after the compiler is done with the decoded values and before the graph is fingerprinted.
    """
    decoders: list[Operator] = []
    known = {id(t) for t in sg.tensors}
    for op in list(sg.operators):
        if any(t.decoded_from is op for t in op.outputs):
            continue  # a decoder already restored: what it reads stays stored
        for t in op.inputs:
            if t is None or t.data is None or t.decoded_from is None:
                continue
            decoder = t.decoded_from
            for stored in decoder.inputs:
                if stored is not None and id(stored) not in known:
                    known.add(id(stored))
                    sg.tensors.append(stored)
            decoders.append(decoder)
            t.data = None
    sg.operators[:0] = decoders
    return len(decoders)
