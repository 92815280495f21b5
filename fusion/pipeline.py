"""The analysis pipeline in one visible place: rewrite -> classify (ECG) -> plan.

    summary = plan_model(tflite_tools.load("model.tflite"), fast_math=False)
"""

from __future__ import annotations

from typing import Callable

from tflite_tools.model import stats
from tflite_tools.model.ir import Model

from .cost import CachedCost, CostSource, RooflineCost
from .ecg import build_ecg
from .plan import PlanConfig, plan_fusion
from .report import PlanSummary
from .rewrite import rewrite


def plan_model(
    model: Model,
    fast_math: bool = False,
    cost: CostSource | None = None,
    config: PlanConfig = PlanConfig(),
    trace: Callable[[str], None] | None = None,
    subgraph: int = 0,
    prefix: str = "",
) -> PlanSummary:
    """Rewrites subgraph `subgraph` of `model` (the entry one by default) in place and plans its
    fused blocks, named `<prefix>block_NNN`.

    Cost answers for yellow cells are cached on disk (see fusion.cost.default_cache_dir).
    """
    sg = model.subgraphs[subgraph]
    ops_before = len(sg.operators)
    intermediates_before = stats.activation_bytes(sg)
    peak_before = stats.peak_live_bytes(sg)
    log = rewrite(model, fast_math=fast_math, trace=trace, subgraph=subgraph)
    cached = CachedCost(cost or RooflineCost())
    plan = plan_fusion(build_ecg(sg), cached, config, prefix)
    cached.save()
    return PlanSummary(ops_before, log, plan, intermediates_before, peak_before)
