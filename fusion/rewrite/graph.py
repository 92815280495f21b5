"""Editing a subgraph in place: the few primitives every rewrite rule is written with.

A rule never touches index lists or signatures itself; it asks for the producer or consumers of
a tensor, creates tensors and ops, and redirects uses. `GraphView.refresh` recomputes the maps
after each applied rewrite (graphs are a few hundred ops: recomputing beats bookkeeping bugs).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tflite_tools.model.builder import make_options, tensor_type
from tflite_tools.model.ir import Model, OpCode, Operator, Subgraph, Tensor, unique_name, with_referenced
from tflite_tools.model.schema import builtin_code


class GraphView:
    """A subgraph with producer / consumer maps and editing helpers."""

    def __init__(self, model: Model, index: int = 0):
        self.model = model
        self.index = index
        self.sg: Subgraph = model.subgraphs[index]
        self._names = {t.name for t in self.sg.tensors}
        self.refresh()

    def refresh(self) -> None:
        """Recomputes producer and consumer maps after an edit."""
        self.producer: dict[int, Operator] = {}
        self.consumers: dict[int, list[Operator]] = {}
        for op in self.sg.operators:
            for t in op.outputs:
                self.producer[id(t)] = op
            for t in op.inputs:
                if t is not None:
                    users = self.consumers.setdefault(id(t), [])
                    if op not in users:
                        users.append(op)
        self.outputs = {id(t) for t in self.sg.outputs}
        self.inputs = {id(t) for t in self.sg.inputs}

    # -- queries ----------------------------------------------------------------------------

    def producer_of(self, t: Tensor | None) -> Operator | None:
        """The op writing `t`, or None for inputs and constants."""
        return None if t is None else self.producer.get(id(t))

    def consumers_of(self, t: Tensor) -> list[Operator]:
        """The ops reading `t`, in execution order."""
        return self.consumers.get(id(t), [])

    def is_boundary(self, t: Tensor) -> bool:
        """True for graph inputs and outputs (their tensors must keep existing)."""
        return id(t) in self.outputs or id(t) in self.inputs

    def single_use(self, t: Tensor) -> bool:
        """True when exactly one op reads `t` and it is not a graph output."""
        return len(self.consumers_of(t)) == 1 and id(t) not in self.outputs

    def produced_by(self, t: Tensor | None, *names: str) -> Operator | None:
        """The producer of `t` if it is one of the op `names`, else None."""
        op = self.producer_of(t)
        return op if op is not None and op.name in names else None

    # -- edits ------------------------------------------------------------------------------

    def unique_name(self, base: str) -> str:
        """A tensor name not yet used in the subgraph."""
        return unique_name(base, self._names)

    def constant(self, base: str, value: Any, dtype: Any = None) -> Tensor:
        """A new constant tensor in the subgraph."""
        arr = np.require(value if dtype is None else np.asarray(value, dtype=dtype), requirements="C")
        t = Tensor(self.unique_name(base), tuple(arr.shape), tensor_type(arr.dtype), data=arr)
        t.data.flags.writeable = False
        self.sg.tensors.append(t)
        return t

    def like(self, template: Tensor, base: str | None = None, shape: Sequence[int] | None = None) -> Tensor:
        """A new non-constant tensor with `template`'s type and quantization."""
        t = Tensor(
            self.unique_name(base or template.name + "/rw"),
            tuple(template.shape if shape is None else shape),
            template.dtype,
            quantization=template.quantization,
        )
        self.sg.tensors.append(t)
        return t

    def make_op(self, name: str, inputs: list[Tensor | None], outputs: list[Tensor], **options: Any) -> Operator:
        """A new builtin op (not yet inserted)."""
        options_type, opts = make_options(name, options)
        return Operator(OpCode(builtin_code(name), None, 1), inputs, outputs, options_type, opts)

    def insert_before(self, anchor: Operator, op: Operator) -> None:
        """Inserts `op` just before `anchor` in execution order."""
        self.sg.operators.insert(self.sg.operators.index(anchor), op)

    def remove_op(self, op: Operator) -> None:
        """Removes `op` from the execution order (its tensors stay until `prune`)."""
        self.sg.operators.remove(op)

    def replace_uses(self, old: Tensor, new: Tensor) -> None:
        """Every reader of `old` (ops, graph outputs, signatures) reads `new` instead."""
        for op in self.sg.operators:
            op.inputs = [new if t is old else t for t in op.inputs]
        self.sg.outputs = [new if t is old else t for t in self.sg.outputs]
        for sig in self.model.signatures:
            if sig.subgraph_index == self.index:
                sig.outputs = {k: (new if t is old else t) for k, t in sig.outputs.items()}

    def bypass(self, op: Operator, source: Tensor, result: Tensor) -> bool:
        """Removes an op whose `result` equals its input `source`, rewiring its readers.

        If `result` is a graph output, `source`'s producer writes `result` directly instead (when
        `source` is an ordinary intermediate). Returns False, changing nothing, when neither is
        possible (for example a graph input passed straight to a graph output).
        """
        if id(result) not in self.outputs:
            self.replace_uses(result, source)
            self.remove_op(op)
            return True
        producer = self.producer_of(source)
        if producer is None or self.is_boundary(source):
            return False
        self.remove_op(op)
        self.replace_uses(source, result)
        producer.outputs = [result if t is source else t for t in producer.outputs]
        return True

    def prune(self) -> int:
        """Drops ops whose outputs nobody reads and tensors nothing references; returns ops dropped."""
        dropped = 0
        changed = True
        while changed:
            changed = False
            self.refresh()
            for op in list(reversed(self.sg.operators)):
                if op.opcode.is_custom or op.name in _SIDE_EFFECTS:
                    continue
                if all(not self.consumers_of(t) and id(t) not in self.outputs for t in op.outputs):
                    self.remove_op(op)
                    dropped += 1
                    changed = True
        used = {id(t) for t in (*self.sg.inputs, *self.sg.outputs)}
        for op in self.sg.operators:
            used.update(id(t) for t in (*op.inputs, *op.outputs, *op.intermediates) if t is not None)
        for sig in self.model.signatures:
            if sig.subgraph_index == self.index:
                used.update(id(t) for t in (*sig.inputs.values(), *sig.outputs.values()))
        kept = [t for t in self.sg.tensors if id(t) in used or t.is_variable]
        referenced = {id(t) for t in with_referenced(kept)}
        self.sg.tensors = [t for t in self.sg.tensors if id(t) in referenced]
        self.refresh()
        return dropped


# Ops that must run even when nothing reads their outputs.
_SIDE_EFFECTS = {"WHILE", "IF", "CALL_ONCE", "ASSIGN_VARIABLE", "VAR_HANDLE", "READ_VARIABLE"}
