"""The analysis pipeline in one visible place: rewrite -> (size) -> classify (ECG) -> plan.

    summary = plan_model(tflite_tools.load("model.tflite"), fast_math=False)
"""

from __future__ import annotations

from typing import Callable

from tflite_tools import runtime
from tflite_tools.model import stats
from tflite_tools.model.errors import ModelError
from tflite_tools.model.ir import Model
from tflite_tools.model.shapes import sized_at_run_time
from tflite_tools.model.writer import serialize

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
    size_as_litert_does(model, subgraph)
    cached = CachedCost(cost or RooflineCost())
    plan = plan_fusion(build_ecg(sg), cached, config, prefix)
    cached.save()
    return PlanSummary(ops_before, log, plan, intermediates_before, peak_before)


def size_as_litert_does(model: Model, subgraph: int) -> None:
    """Gives every tensor of a subgraph with open dimensions the shape LiteRT gives it when it
    prepares the model at its inputs' own shapes. Converters write 1 for each open dimension, also
    where a size is a product with one (a batch of 16 rows flattened is [16, 64] at batch 1, not the
    [1, 64] written): kernels built from those shapes would not fit (the delegate declines them).
    Tensors sized only as the model runs keep theirs (no kernel takes them); where LiteRT cannot
    prepare the subgraph alone (a control-flow body), nothing changes."""
    sg = model.subgraphs[subgraph]
    if not any(t.is_dynamic for t in sg.tensors):
        return
    try:
        shapes = runtime.tensor_shapes(serialize(model), subgraph, {})
    except ModelError:
        return
    running = sized_at_run_time(sg.operators)
    for t, shape in zip(sg.tensors, shapes):
        if shape is not None and id(t) not in running and not t.is_constant:
            t.shape = shape
