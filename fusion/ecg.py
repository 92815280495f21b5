"""The Extended Computational Graph (DNNFusion §3.2): the graph IR annotated for fusion.

Each node carries its mapping type (per op and per input edge), its algebraic properties, and
whether it may be fused at all; each tensor its intermediate-result size (IRS). `IR_removable`
depends on a fusion plan, so it is a query (`ir_removable`) rather than a stored flag.

Nodes are numbered by execution order, which TFLite guarantees is topological, so "later"
always means "downstream or unrelated".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from tflite_tools.model.hybrid import is_hybrid
from tflite_tools.model.ir import Operator, Subgraph, Tensor
from tflite_tools.model.shapes import sized_at_run_time

from .mapping import MappingType, Prop, edge_type, op_info, op_mapping

# Element types a fused kernel can hold. Strings, resources and variants stay with TFLite.
FUSIBLE_TYPES = {"FLOAT32", "FLOAT16", "INT8", "UINT8", "INT16", "INT32", "INT64", "BOOL"}


@dataclass
class Node:
    """One operator with its fusion annotations."""

    index: int
    op: Operator
    mapping: MappingType | None  # None when opaque
    props: Prop
    edges: list[MappingType | None]  # per input; None for omitted inputs
    opaque_reason: str | None = None  # why the node can never be fused

    @property
    def fusible(self) -> bool:
        """True when the node may join a fused block."""
        return self.opaque_reason is None

    @property
    def name(self) -> str:
        """The op's schema name."""
        return self.op.name


@dataclass
class ECG:
    """A subgraph with per-node annotations and producer/consumer maps."""

    subgraph: Subgraph
    nodes: list[Node]
    producer: dict[int, int] = field(default_factory=dict)  # id(tensor) -> node index
    consumers: dict[int, list[int]] = field(default_factory=dict)  # id(tensor) -> node indices
    graph_outputs: set[int] = field(default_factory=set)  # id(tensor)

    def successors(self, i: int) -> list[int]:
        """Nodes reading any output of node `i`, in execution order."""
        found = {c for t in self.nodes[i].op.outputs for c in self.consumers.get(id(t), [])}
        return sorted(found)

    def predecessors(self, i: int) -> list[int]:
        """Nodes writing any input of node `i`, in execution order."""
        found = {self.producer[id(t)] for t in self.nodes[i].op.inputs if t is not None and id(t) in self.producer}
        return sorted(found)

    def irs_bytes(self, i: int) -> int:
        """The intermediate-result size of node `i`: the bytes of its outputs."""
        return sum(t.nbytes for t in self.nodes[i].op.outputs)

    def ir_removable(self, t: Tensor, block: Iterable[int]) -> bool:
        """True when `t` need never be materialised: every consumer is in `block` (and so is its
        producer) and it is not a graph output."""
        members = set(block)
        if id(t) in self.graph_outputs or self.producer.get(id(t)) not in members:
            return False
        return all(c in members for c in self.consumers.get(id(t), []))


def _int4_weights(op: Operator, t: Tensor) -> bool:
    """True for the INT4 constant weights of a dynamic-range FULLY_CONNECTED: the one op LiteRT's
    kernels take them in (unpacked to int8, as the lowering reads them)."""
    return (t.type_name == "INT4" and t.is_constant and op.name == "FULLY_CONNECTED" and len(op.inputs) > 1
            and op.inputs[1] is t and is_hybrid(op))


def _opaque_reason(op: Operator, mapping: MappingType | None, run_time_sized: set[int]) -> str | None:
    if mapping is None and op.opcode.is_custom:
        return f"custom op {op.opcode.custom_code}"
    if mapping is None:
        return f"{op.name} has no mapping type (opaque)"
    tensors = [t for t in (*op.inputs, *op.outputs) if t is not None]
    for t in tensors:
        if id(t) in run_time_sized:
            return f"{t.name!r} is sized only when the model runs"
        if t.num_elements == 0:  # nothing to compute, and no memory a kernel could be handed
            return f"{t.name!r} holds no elements"
        if t.type_name not in FUSIBLE_TYPES and not _int4_weights(op, t):
            return f"{t.type_name} tensor {t.name!r}"
        if t.is_variable:
            return f"variable tensor {t.name!r}"
        if t.sparsity is not None:  # read sparse by TFLite's own kernel; DENSIFY would fold it
            return f"sparse tensor {t.name!r}"
    return None


def build_ecg(sg: Subgraph) -> ECG:
    """Annotates a subgraph: mapping types, properties, fusibility and producer/consumer maps."""
    nodes = []
    producer: dict[int, int] = {}
    consumers: dict[int, list[int]] = {}
    run_time_sized = sized_at_run_time(sg.operators)
    for i, op in enumerate(sg.operators):
        info = op_info(op)
        mapping = op_mapping(op)
        edges = [None if t is None else edge_type(op, k) for k, t in enumerate(op.inputs)]
        nodes.append(Node(i, op, mapping, info.props if info else Prop.NONE, edges,
                          _opaque_reason(op, mapping, run_time_sized)))
        for t in op.outputs:
            producer[id(t)] = i
        for t in op.inputs:
            if t is not None and not t.is_constant:
                consumers.setdefault(id(t), [])
                if i not in consumers[id(t)]:
                    consumers[id(t)].append(i)
    return ECG(sg, nodes, producer, consumers, {id(t) for t in sg.outputs})
