"""The rewrite pipeline: cleanup to a fixpoint, the algebraic family greedily, cleanup again.

    cleanup   — constant folding, identities, data-movement chains, affine folding (fixpoint)
    algebraic — DNNFusion §4.2: the graph is split into sub-graphs at ops with none of the
                associative / commutative / distributive properties; within each, the match that
                removes the most FLOPs is applied, and matching repeats until nothing matches
    cleanup   — again, to fold what reassociation exposed
    prune     — dead ops and unreferenced tensors

One subgraph is rewritten per call (each signature's, each control-flow body's); the model is
changed in place.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from tflite_tools.model.ir import Model, Operator

from ..mapping import Prop, op_info
from . import algebraic, cleanup  # noqa: F401 - importing registers the rules
from .base import RULES, Rewrite, Rule
from .graph import GraphView

# A rewrite removes or simplifies an op, so a graph of N ops settles long before this many rounds;
# the bound only guards against a rule pair that undoes each other.
MAX_ROUNDS_PER_OP = 8


@dataclass
class RewriteLog:
    """How often each rule fired (the `--explain` report)."""

    counts: Counter = field(default_factory=Counter)
    ops_before: int = 0
    ops_after: int = 0


def active_rules(family: str, fast_math: bool) -> list[Rule]:
    """The rules of a family that run under the given policy, in registration order."""
    return [r for r in RULES if r.family == family and (r.exact or fast_math)]


def _matches(g: GraphView, rules: list[Rule], skip: set[tuple[str, Operator]]) -> list[tuple[Rule, Operator, Rewrite]]:
    found = []
    for op in list(g.sg.operators):
        for r in rules:
            if (r.name, op) in skip:
                continue
            m = r.match(g, op)
            if m is not None:
                found.append((r, op, m))
    return found


def _apply(g: GraphView, r: Rule, op: Operator, m: Rewrite, log: RewriteLog,
           failed: set[tuple[str, Operator]], trace: Callable[[str], None] | None) -> None:
    """Applies one match (if its anchor op still exists), records it, and refreshes the maps."""
    if op in g.sg.operators and m.apply():
        log.counts[r.name] += 1
        if trace:
            trace(f"{r.name} at {op.name} (saves {m.saved_flops} FLOPs)")
    else:
        failed.add((r.name, op))
    g.refresh()


def _run_cleanup(g: GraphView, fast_math: bool, log: RewriteLog, trace: Callable[[str], None] | None) -> None:
    rules = active_rules("cleanup", fast_math)
    failed: set[tuple[str, Operator]] = set()  # holding the op keeps its id unique
    for _ in range(MAX_ROUNDS_PER_OP * max(1, len(g.sg.operators))):
        found = _matches(g, rules, failed)
        if not found:
            return
        _apply(g, *found[0], log, failed, trace)


def property_components(g: GraphView) -> dict[int, int]:
    """Maps id(op) to its sub-graph: ops with algebraic properties joined through shared tensors."""
    parent: dict[int, int] = {}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    ops = [op for op in g.sg.operators if (info := op_info(op)) is not None and info.props != Prop.NONE]
    for op in ops:
        parent[id(op)] = id(op)
    for op in ops:
        for t in op.inputs:
            p = g.producer_of(t)
            if p is not None and id(p) in parent:
                parent[find(id(op))] = find(id(p))
    return {k: find(k) for k in parent}


def _run_algebraic(g: GraphView, fast_math: bool, log: RewriteLog, trace: Callable[[str], None] | None) -> None:
    rules = active_rules("algebraic", fast_math)
    failed: set[tuple[str, Operator]] = set()  # holding the op keeps its id unique
    for _ in range(MAX_ROUNDS_PER_OP * max(1, len(g.sg.operators))):
        components = property_components(g)
        best: dict[int, tuple[int, int, int, Rule, Operator, Rewrite]] = {}
        order = {id(op): i for i, op in enumerate(g.sg.operators)}
        for r, op, m in _matches(g, rules, failed):
            comp = components.get(id(op), -order[id(op)] - 1)
            key = (-m.saved_flops, order[id(op)], rules.index(r))
            if comp not in best or key < best[comp][:3]:
                best[comp] = (*key, r, op, m)
        if not best:
            return
        # The sub-graphs are disjoint, so each one's best rewrite can be applied in the same round.
        for *_, r, op, m in sorted(best.values(), key=lambda v: v[:3]):
            _apply(g, r, op, m, log, failed, trace)


def rewrite(model: Model, fast_math: bool = False, trace: Callable[[str], None] | None = None,
            subgraph: int = 0) -> RewriteLog:
    """Rewrites subgraph `subgraph` (the entry one by default) in place; returns how often each rule fired.

    Exact rules always run. With `fast_math`, rules that change floating-point rounding run too.
    `trace`, if given, receives one line per applied rewrite and the op list after each pass.
    """
    g = GraphView(model, subgraph)
    log = RewriteLog(ops_before=len(g.sg.operators))
    passes = (
        ("cleanup", lambda: _run_cleanup(g, fast_math, log, trace)),
        ("algebraic", lambda: _run_algebraic(g, fast_math, log, trace)),
        ("cleanup", lambda: _run_cleanup(g, fast_math, log, trace)),
        ("prune", lambda: log.counts.update(dead_code=g.prune())),
    )
    for name, run in passes:
        run()
        if trace:
            trace(f"after {name}: " + " ".join(op.name for op in g.sg.operators))
    log.counts = Counter({k: v for k, v in log.counts.items() if v})
    log.ops_after = len(g.sg.operators)
    return log
