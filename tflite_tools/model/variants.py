"""Input shapes besides the model's own that `fuse --shape` compiles kernels for.

A kernel is compiled for fixed shapes. A model that is resized after loading (a batch of four, a
prompt of 200 tokens) keeps its kernels only where the bundle holds a graph compiled at the new
shapes: a shape variant. Each names new shapes for some inputs of one subgraph, the entry one or a
signature's (`[SIGNATURE:]INPUT=DIMS[,INPUT=DIMS...]`, DIMS as `1x128`). LiteRT sizes every other
tensor of that subgraph at those shapes (runtime.tensor_shapes: its own shape rules, not ours), and
the subgraph is copied with them (with_shapes) to be compiled under the same plan as its own shapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence

from .errors import ModelError
from .ir import Model, Operator, Subgraph, Tensor


@dataclass(frozen=True)
class ShapeVariant:
    """New shapes for inputs of one subgraph, as `fuse --shape` takes them."""

    text: str  # as written
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # ([SIGNATURE:]INPUT, dims)


_ITEM = re.compile(r"^(?P<name>.+)=(?P<dims>\d+(?:x\d+)*)$")


def parse_variant(text: str) -> ShapeVariant:
    """Reads `[SIGNATURE:]INPUT=DIMS[,[SIGNATURE:]INPUT=DIMS...]`; raises ModelError saying what is
    wrong. Which part names a signature is decided against the model (resolve): tensor names hold
    colons too (`serving_default_x:0`)."""
    inputs = []
    for item in text.split(","):
        match = _ITEM.match(item.strip())
        if match is None:
            raise ModelError(f"--shape {text!r}: expected [SIGNATURE:]INPUT=DIMS[,INPUT=DIMS...], DIMS as 1x128")
        dims = tuple(int(d) for d in match["dims"].split("x"))
        if 0 in dims:
            raise ModelError(f"--shape {text!r}: {match['name']} has a dimension of 0")
        inputs.append((match["name"].strip(), dims))
    if len({name for name, _ in inputs}) != len(inputs):
        raise ModelError(f"--shape {text!r}: an input is named twice")
    return ShapeVariant(text, tuple(inputs))


def _find_input(model: Model, name: str) -> tuple[int, Tensor] | None:
    """The subgraph and input tensor `name` means: `SIGNATURE:KEY` or `SIGNATURE:TENSOR` for a
    signature's input, else a signature input key or tensor name of the entry subgraph."""
    signature, _, rest = name.partition(":")
    for s in model.signatures:
        if s.key == signature and rest:
            sg = model.subgraphs[s.subgraph_index]
            found = s.inputs.get(rest) or next((t for t in sg.inputs if t.name == rest), None)
            return (s.subgraph_index, found) if found is not None else None
    entry = next((s.inputs for s in model.signatures if s.subgraph_index == 0), {})
    found = entry.get(name) or next((t for t in model.subgraphs[0].inputs if t.name == name), None)
    return (0, found) if found is not None else None


def resolve(model: Model, variant: ShapeVariant) -> tuple[int, dict[int, tuple[int, ...]]]:
    """The subgraph `variant` resizes and, by tensor index there, each input's new dims. Raises
    ModelError for a name the model lacks, a rank that differs, or inputs of two subgraphs."""
    index, resized = None, {}
    for name, dims in variant.inputs:
        found = _find_input(model, name)
        if found is None:
            listed = ", ".join([t.name for t in model.subgraphs[0].inputs] +
                               [f"{s.key}:{key}" for s in model.signatures for key in s.inputs])
            raise ModelError(f"--shape {variant.text!r}: the model has no input {name!r} (inputs: {listed})")
        where, tensor = found
        if index is not None and where != index:
            raise ModelError(f"--shape {variant.text!r}: names inputs of two subgraphs; give each its own --shape")
        if len(dims) != len(tensor.shape):
            raise ModelError(f"--shape {variant.text!r}: {name} has rank {len(tensor.shape)}, not {len(dims)}")
        index = where
        resized[next(k for k, t in enumerate(model.subgraphs[where].tensors) if t is tensor)] = dims
    return index, resized


def with_shapes(sg: Subgraph, shapes: Sequence[tuple[int, ...] | None]) -> tuple[Subgraph, dict[int, Tensor]]:
    """A copy of `sg` whose tensor k has shape `shapes[k]` (its own where that is None), and the copy
    of each tensor by id() of the original. Constant data is shared, not copied; the nodes a decoded
    weight came from (Tensor.decoded_from) are copied with it, so restoring stored weights in the
    copy leaves the original as it is (fusion.rewrite.fold.restore_decoded)."""
    copies = {id(t): replace(t, shape=t.shape if shape is None else tuple(shape))
              for t, shape in zip(sg.tensors, shapes)}

    def copied(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        if id(t) not in copies:  # outside the graph: a stored weight (shared), or a decoded one in a chain
            copies[id(t)] = t if t.decoded_from is None else replace(t)
            if t.decoded_from is not None:
                copies[id(t)].decoded_from = copy_op(t.decoded_from)
        return copies[id(t)]

    def copy_op(op: Operator) -> Operator:
        return replace(op, inputs=[copied(t) for t in op.inputs], outputs=[copied(t) for t in op.outputs],
                       intermediates=[copied(t) for t in op.intermediates])

    for t in sg.tensors:
        if t.decoded_from is not None:
            copies[id(t)].decoded_from = copy_op(t.decoded_from)
    copy = replace(sg, tensors=[copies[id(t)] for t in sg.tensors], operators=[copy_op(op) for op in sg.operators],
                   inputs=[copies[id(t)] for t in sg.inputs], outputs=[copies[id(t)] for t in sg.outputs])
    return copy, copies
