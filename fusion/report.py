"""What `tflite_tools fuse --plan-only` prints: the plan as JSON, text and Graphviz."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tflite_tools.model import stats
from tflite_tools.model.ir import Subgraph

from .plan import Plan
from .rewrite import RewriteLog


@dataclass
class PlanSummary:
    """Before / after figures of one planned subgraph."""

    ops_before: int
    rewrite: RewriteLog
    plan: Plan
    intermediate_bytes_before: int
    peak_bytes_before: int

    @property
    def subgraph(self) -> Subgraph:
        """The rewritten subgraph the plan covers."""
        return self.plan.ecg.subgraph

    def to_json(self) -> dict[str, Any]:
        """The plan as plain JSON-ready data (the `--json` output)."""
        plan, sg = self.plan, self.subgraph
        steps = plan.steps()
        blocks = []
        for b in plan.blocks:
            blocks.append(
                {
                    "name": b.name,
                    "ops": list(b.ops),
                    "op_names": [plan.ecg.nodes[i].name for i in b.ops],
                    "fused_type": None if b.mapping is None else b.mapping.short,
                    "inputs": [t.name for t in b.inputs],
                    "outputs": [t.name for t in b.outputs],
                    "removed_intermediates": [t.name for t in b.removable],
                    "signature": b.signature,
                    **({"opaque": b.opaque_reason} if b.opaque_reason else {}),
                }
            )
        return {
            "ops": self.ops_before,
            "ops_after_rewrite": len(sg.operators),
            "blocks": blocks,
            "fused_blocks": sum(1 for b in plan.blocks if b.fused),
            "fusion_rate": round(self.ops_before / max(1, len(plan.blocks)), 3),
            "intermediate_bytes_before": self.intermediate_bytes_before,
            "intermediate_bytes_after": stats.activation_bytes(sg, steps),
            "peak_bytes_before": self.peak_bytes_before,
            "peak_bytes_after": stats.peak_live_bytes(sg, steps),
            "rewrites": dict(self.rewrite.counts),
            "planner_decisions": dict(plan.decisions),
            "cost_queries": plan.cost_queries,
        }


def format_summary(summary: PlanSummary, source: str, explain: bool = False) -> str:
    """The human-readable plan report."""
    data = summary.to_json()
    lines = [
        f"model: {source}",
        f"ops: {data['ops']} before rewriting, {data['ops_after_rewrite']} after",
        f"blocks: {len(data['blocks'])} ({data['fused_blocks']} fused), fusion rate {data['fusion_rate']:.2f}",
        f"intermediates: {stats.human_bytes(data['intermediate_bytes_before'])} -> "
        f"{stats.human_bytes(data['intermediate_bytes_after'])}",
        f"peak live activations: {stats.human_bytes(data['peak_bytes_before'])} -> {stats.human_bytes(data['peak_bytes_after'])}",
    ]
    if explain:
        lines.append("rewrites:" + ("" if data["rewrites"] else " none fired"))
        for rule, count in sorted(data["rewrites"].items()):
            lines.append(f"  {rule:<36} {count:>4}")
        decisions = ", ".join(f"{k} {v}" for k, v in sorted(data["planner_decisions"].items()))
        lines.append(f"planner: {decisions or 'nothing to decide'}; {data['cost_queries']} cost queries")
    lines.append("")
    lines.append(f"{'block':<10} {'type':<8} {'in':>3} {'out':>3}  ops")
    for b in data["blocks"]:
        kind = b["fused_type"] or "opaque"
        ops = " ".join(b["op_names"])
        lines.append(f"{b['name']:<10} {kind:<8} {len(b['inputs']):>3} {len(b['outputs']):>3}  {ops}")
    return "\n".join(lines)


BLOCK_COLORS = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]


def to_dot(summary: PlanSummary) -> str:
    """The rewritten graph in Graphviz, one cluster and colour per fused block."""
    plan = summary.plan
    ecg = plan.ecg
    lines = ["digraph plan {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    for k, b in enumerate(plan.blocks):
        color = BLOCK_COLORS[k % len(BLOCK_COLORS)] if b.fused else "white"
        if b.fused:
            kind = b.mapping.short if b.mapping is not None else "opaque"
            lines.append(f'  subgraph cluster_{k} {{ label="{b.name} ({kind})"; style=dashed;')
        for i in b.ops:
            node = ecg.nodes[i]
            label = node.name + (f"\\n{node.op.fused_activation}" if node.op.fused_activation else "")
            lines.append(f'    n{i} [label="{label}", fillcolor="{color}"];')
        if b.fused:
            lines.append("  }")
    for i in range(len(ecg.nodes)):
        for s in ecg.successors(i):
            lines.append(f"  n{i} -> n{s};")
    lines.append("}")
    return "\n".join(lines) + "\n"
