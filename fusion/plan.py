"""Fusion-plan generation (DNNFusion §4.3, Listing 1): grow blocks from seeds along the ECG.

The algorithm, and where it departs from the paper's text:

0. **Table 3 as rebuilt in table3.py**, with three measured exceptions: a pointwise conv ->
   depthwise conv -> pointwise conv chain (MobileNet's inverted residual), reductions over the
   innermost axis of the same rows (LayerNorm's two MEANs) and the attention core (scores,
   softmax, weights x values) are yellow, not red.
1. **Seed**: the unfused One-to-One op with the smallest intermediate result (ties: the earlier
   op). When no One-to-One op is left, the remaining fusible ops seed in the same order, lowest
   impedance first — an extension that lets Reorganize / Shuffle chains and Conv -> Resize pairs
   fuse too; the paper stops at One-to-One seeds.
2. **Grow along successors**, recursively: look up Table 3 with the block's *accumulated* fused
   type first and the successor's type second; red stops, green fuses, yellow asks the cost source
   (fuse if latency(block + op) <= latency(block) + latency(op)). Then the constraints and the
   convexity check.
3. **Grow along predecessors** the same way (the predecessor's type first). An op with several
   predecessors may fuse some and not others.
   *Epilogues first*: an elementwise seed that a Many-to-Many op produces grows along its
   predecessors before its successors (PlanConfig.epilogue_first). Both cells are green, but the
   paper's order put an activation between two matrix products (bert's FC -> GELU -> FC), a
   residual ADD between two inverted residuals and a swish between two convolutions into the
   *consumer's* block, where a reduction reads each element many times, so the op is materialised
   before it (one more pass over memory); in the producer's block it is computed once per
   element on the register tile, before the result is stored (measured side by side:
   bench/RESULTS-history.md, "Epilogues first"). Data movement (a
   CONCATENATION read in place by the convolution after it) keeps the paper's order, and so do ARM
   targets (halide_gen.targets.TargetSpec.plan_config): NEON's register tile leaves no room for an
   epilogue's constants, and the spills cost more than the pass they save.
4. Steps 2 and 3 repeat until the block stops growing (the paper runs each once), so a block can
   take in an op that shares its input — LayerNorm's `x` feeds MEAN, SQUARED_DIFFERENCE and SUB.
5. Ops no block took — opaque ones included — become blocks of one.

Convexity is checked on the graph with finished blocks contracted to single nodes, so no two
blocks can depend on each other. A tensor with a consumer outside its block, or that is a graph
output, stays a block output; the rest are `IR_removable` and never materialised.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from tflite_tools.model.ir import Tensor
from tflite_tools.model.stats import Step

from .cost import CostSource, RooflineCost, profitable
from .ecg import ECG
from .mapping import MappingType, MtM, OtO, op_info
from .signature import block_signature
from .table3 import Cell, Color, attention_allowed, cell, conv_chain_allowed, row_reductions_allowed


@dataclass(frozen=True)
class PlanConfig:
    """Constraint thresholds (Listing 1 step 2.2). The paper calls its threshold "empirically
    determined" and does not publish it; these bound what one Halide pipeline should hold."""

    max_ops: int = 48
    # Distinct non-constant tensors a block reads / writes: each is a buffer argument and a stream.
    max_inputs: int = 8
    max_outputs: int = 4
    # Register-pressure proxy: values the innermost loop keeps in flight — non-constant inputs,
    # non-scalar constants, and intermediates read by more than one op of the block. 24 leaves
    # room for accumulators among NEON's 32 vector registers.
    max_live_values: int = 24
    # Bytes of intermediates the block must still materialise (a Many-to-Many result read by a
    # data-movement op inside the block).
    max_intermediate_bytes: int = 8 << 20
    # Whether the attention core may pass the red cell (table3.attention_allowed). Off for GPU
    # targets: each of its stages is a launch of its own there either way (seven for the fused
    # core of the test transformer, as many as its three blocks apart took), so fusing gains
    # nothing; the row-tile schedule that keeps the scores out of memory is the CPU's.
    attention_core: bool = True
    # Whether an elementwise seed produced by a Many-to-Many op grows into that op's block (its
    # epilogue) before its consumers' (step 3 of the module docstring); False: the paper's order
    # (ARM targets: halide_gen.targets.TargetSpec.plan_config).
    epilogue_first: bool = True


@dataclass
class Block:
    """A planned group of ops that becomes one kernel."""

    name: str
    ops: tuple[int, ...]  # ECG node indices, ascending
    mapping: MappingType | None  # the fused type; None for an opaque op
    inputs: list[Tensor]  # non-constant tensors read from outside
    constants: list[Tensor]
    outputs: list[Tensor]  # tensors still needed outside (or graph outputs)
    removable: list[Tensor]  # intermediates that are never materialised
    signature: str
    opaque_reason: str | None = None

    @property
    def fused(self) -> bool:
        """True for a block of more than one op."""
        return len(self.ops) > 1


@dataclass
class Plan:
    """Blocks in an execution order that respects every dependency."""

    ecg: ECG
    blocks: list[Block]
    config: PlanConfig
    cost_queries: int = 0
    decisions: dict[str, int] = field(default_factory=dict)  # "green" / "yellow-yes" / ... counts

    def steps(self) -> list[Step]:
        """The blocks as lifetime-analysis steps (tensors internal to a block never appear)."""
        return [Step(b.inputs + b.constants, b.outputs) for b in self.blocks]


class _Planner:
    def __init__(self, ecg: ECG, cost: CostSource, config: PlanConfig):
        self.ecg = ecg
        self.cost = cost
        self.config = config
        self.block_id: dict[int, int] = {}  # op -> index into self.groups
        self.groups: list[frozenset[int]] = []
        self.types: list[MappingType | None] = []  # each group's accumulated Table 3 type
        self.queries = 0
        self.decisions: dict[str, int] = {}

    # -- checks -----------------------------------------------------------------------------

    def creates_cycle(self, members: frozenset[int]) -> bool:
        """True if a path leaves `members` and comes back, with finished blocks contracted."""
        ecg = self.ecg
        stack = [s for n in members for s in ecg.successors(n) if s not in members]
        seen: set[int] = set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            group = self.groups[self.block_id[n]] if n in self.block_id else (n,)
            for m in group:
                seen.add(m)
                for s in ecg.successors(m):
                    if s in members:
                        return True
                    if s not in seen:
                        stack.append(s)
        return False

    def violates_constraints(self, members: frozenset[int]) -> str | None:
        cfg, ecg = self.config, self.ecg
        if len(members) > cfg.max_ops:
            return "max_ops"
        reads: dict[int, Tensor] = {}
        in_block_reads: dict[int, int] = {}
        for i in members:
            for t in ecg.nodes[i].op.inputs:
                if t is None:
                    continue
                if ecg.producer.get(id(t)) in members:
                    in_block_reads[id(t)] = in_block_reads.get(id(t), 0) + 1
                else:
                    reads[id(t)] = t
        inputs = [t for t in reads.values() if not t.is_constant]
        if len(inputs) > cfg.max_inputs:
            return "max_inputs"
        outputs = [t for i in members for t in ecg.nodes[i].op.outputs if not ecg.ir_removable(t, members)]
        if len(outputs) > cfg.max_outputs:
            return "max_outputs"
        wide_constants = [t for t in reads.values() if t.is_constant and t.num_elements > 1]
        shared = [k for k, n in in_block_reads.items() if n > 1]
        if len(inputs) + len(wide_constants) + len(shared) > cfg.max_live_values:
            return "max_live_values"
        materialised = 0
        for i in members:
            if ecg.nodes[i].mapping != MtM:
                continue
            for t in ecg.nodes[i].op.outputs:
                readers = [c for c in ecg.consumers.get(id(t), []) if c in members]
                if any(ecg.nodes[c].mapping not in (OtO, MtM) for c in readers):
                    materialised += t.nbytes
        if materialised > cfg.max_intermediate_bytes:
            return "max_intermediate_bytes"
        return None

    # -- growth -----------------------------------------------------------------------------

    def try_add(self, block: set[int], btype: list[MappingType], n: int, forward: bool) -> bool:
        node = self.ecg.nodes[n]
        if n in block or n in self.block_id or not node.fusible:
            return False
        c = cell(btype[0], node.mapping) if forward else cell(node.mapping, btype[0])
        if c.color is Color.RED and (
                (btype[0] is MtM and node.mapping is MtM and conv_chain_allowed(self.ecg, block, n))
                or row_reductions_allowed(self.ecg, block, n)
                or (self.config.attention_core and attention_allowed(self.ecg, block, n))):
            # The measured exceptions (table3.py): inverted residuals, row reductions, attention.
            c = Cell(MtM, Color.YELLOW)
        if c.color is Color.RED:
            self._count("red")
            return False
        members = frozenset(block | {n})
        if self.violates_constraints(members) or self.creates_cycle(members):
            self._count("constraint")
            return False
        if c.color is Color.YELLOW:
            self.queries += 1
            if not profitable(self.cost, self.ecg, frozenset(block), n):
                self._count("yellow-no")
                return False
            self._count("yellow-yes")
        else:
            self._count("green")
        block.add(n)
        btype[0] = c.fused
        return True

    def grow(self, block: set[int], btype: list[MappingType], start: int, forward: bool) -> bool:
        grew = False
        neighbours = self.ecg.successors(start) if forward else self.ecg.predecessors(start)
        for n in neighbours:
            if self.try_add(block, btype, n, forward):
                grew = True
                self.grow(block, btype, n, forward)
        return grew

    def directions(self, seed: int) -> tuple[bool, bool]:
        """The order a seed's block grows in (True: along successors): the paper's, successors
        first, except for an elementwise op that a Many-to-Many op produces, which looks to its
        producer's epilogue first (PlanConfig.epilogue_first)."""
        ecg = self.ecg
        info = op_info(ecg.nodes[seed].op)
        if (self.config.epilogue_first and info is not None and info.elementwise
                and any(ecg.nodes[p].mapping is MtM for p in ecg.predecessors(seed))):
            return (False, True)
        return (True, False)

    def _count(self, key: str) -> None:
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def run(self) -> None:
        ecg = self.ecg
        # Seeds: lowest impedance first, then smallest intermediate result, then earliest op.
        seeds = sorted(
            (n.mapping, ecg.irs_bytes(n.index), n.index) for n in ecg.nodes if n.fusible
        )
        for _, _, seed in seeds:
            if seed in self.block_id:
                continue
            block = {seed}
            btype = [ecg.nodes[seed].mapping]
            grew = True
            directions = self.directions(seed)
            while grew:
                grew = False
                for forward in directions:
                    for i in sorted(block):
                        grew |= self.grow(block, btype, i, forward)
            self._finish(frozenset(block), btype[0])
        for n in ecg.nodes:
            if n.index not in self.block_id:
                self._finish(frozenset({n.index}), n.mapping)

    def _finish(self, members: frozenset[int], mapping: MappingType | None) -> None:
        self.groups.append(members)
        self.types.append(mapping)
        for i in members:
            self.block_id[i] = len(self.groups) - 1

    # -- result -----------------------------------------------------------------------------

    def ordered_groups(self) -> list[int]:
        """Groups in a topological order of the contracted graph (earliest first op on ties)."""
        ecg = self.ecg
        deps: dict[int, set[int]] = {g: set() for g in range(len(self.groups))}
        for g, members in enumerate(self.groups):
            for i in members:
                for p in ecg.predecessors(i):
                    if self.block_id[p] != g:
                        deps[g].add(self.block_id[p])
        users: dict[int, set[int]] = {g: set() for g in deps}
        for g, ds in deps.items():
            for d in ds:
                users[d].add(g)
        ready = [(min(self.groups[g]), g) for g, ds in deps.items() if not ds]
        heapq.heapify(ready)
        order = []
        remaining = {g: len(ds) for g, ds in deps.items()}
        while ready:
            _, g = heapq.heappop(ready)
            order.append(g)
            for u in users[g]:
                remaining[u] -= 1
                if remaining[u] == 0:
                    heapq.heappush(ready, (min(self.groups[u]), u))
        assert len(order) == len(self.groups), "fusion plan has a cycle between blocks"
        return order


def _describe(ecg: ECG, members: frozenset[int], name: str, fused_type: MappingType | None) -> Block:
    reads: dict[int, Tensor] = {}
    for i in sorted(members):
        for t in ecg.nodes[i].op.inputs:
            if t is not None and ecg.producer.get(id(t)) not in members and id(t) not in reads:
                reads[id(t)] = t
    outputs, removable = [], []
    for i in sorted(members):
        for t in ecg.nodes[i].op.outputs:
            (removable if ecg.ir_removable(t, members) else outputs).append(t)
    only = ecg.nodes[min(members)]
    return Block(
        name=name,
        ops=tuple(sorted(members)),
        mapping=fused_type,
        inputs=[t for t in reads.values() if not t.is_constant],
        constants=[t for t in reads.values() if t.is_constant],
        outputs=outputs,
        removable=removable,
        signature=block_signature(ecg, members),
        opaque_reason=only.opaque_reason if len(members) == 1 else None,
    )


def plan_fusion(ecg: ECG, cost: CostSource | None = None, config: PlanConfig = PlanConfig(), prefix: str = "") -> Plan:
    """Partitions every op of `ecg` into blocks named `<prefix>block_NNN`. Deterministic: same
    graph, same blocks, same names."""
    planner = _Planner(ecg, cost or RooflineCost(), config)
    planner.run()
    blocks = []
    for k, g in enumerate(planner.ordered_groups()):
        blocks.append(_describe(ecg, planner.groups[g], f"{prefix}block_{k:03d}", planner.types[g]))
    return Plan(ecg, blocks, config, planner.queries, planner.decisions)

