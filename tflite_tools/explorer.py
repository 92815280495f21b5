"""Overlays of a fuse output for Model Explorer (Google's graph viewer for TFLite,
`ai-edge-model-explorer`): node data in its format that colours each node of `model.fused.tflite`
by the fused block it belongs to, by whether the delegate claims it by default, or by its block's
time from the delegate's `profile` file.

    blocks = block_overlay(result)                      # one colour per block
    write_overlay(claims_overlay(result), "claims.json")
    write_overlay(time_overlay(result, "profile.jsonl"), "time.json")

Model Explorer names a TFLite subgraph by its name, else its signature's key, and each operator by
its index: the keys here are the same (`graph_id`), so the overlay lands on the fused model as
Model Explorer shows it (`model_explorer --node_data_paths` or the viewer's "Add per-node data").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from fusion.report import BLOCK_COLORS

from .model.atomic import write_bytes_atomic
from .model.ir import Model
from .model.reader import load

if TYPE_CHECKING:  # the overlay reads fuse's records; fuse writes the overlays
    from .fuse import FuseResult, KernelRecord

CLAIMED, NOT_CLAIMED = "#66bb6a", "#ef9a9a"


def graph_id(model: Model, index: int) -> str:
    """Model Explorer's id of subgraph `index`: its name, else the key of the signature that runs
    it, else `subgraph_<index>`."""
    keys = [s.key for s in model.signatures if s.subgraph_index == index and s.key]
    return model.subgraphs[index].name or (keys[0] if keys else f"subgraph_{index}")


def _overlay(result: FuseResult, model: Model | None, name: str,
             value: Callable[[int, KernelRecord], dict | None]) -> dict:
    """ModelNodeData: per graph id, {"name", "results": {node index: {"value", "bgColor"}}} from
    value(ordinal of the block in its subgraph, its record) for each block of the model's own shapes
    (`model`: the fused model, loaded from result.model when None)."""
    model = model or load(result.model)
    graphs: dict[str, dict] = {}
    ordinals: dict[int, int] = {}
    for record in result.kernels:
        if record.shapes is not None:
            continue  # a --shape variant: the same nodes as its subgraph's own block
        k = ordinals[record.subgraph] = ordinals.get(record.subgraph, -1) + 1
        data = value(k, record)
        if data is not None:
            graph = graphs.setdefault(graph_id(model, record.subgraph), {"name": name, "results": {}})
            graph["results"].update({str(n): data for n in record.nodes})
    return graphs


def block_overlay(result: FuseResult, model: Model | None = None) -> dict:
    """Each node of a block with a kernel valued by the block's number in its subgraph, one colour
    per block; nodes left to TFLite carry nothing."""
    return _overlay(result, model, "dnnfusion block", lambda k, r: {"value": k, "bgColor": BLOCK_COLORS[k % len(BLOCK_COLORS)]}
                    if r.kernel else None)


def claims_overlay(result: FuseResult, model: Model | None = None) -> dict:
    """Each node of a block with a kernel valued 1 where the delegate claims it under its default
    policy at one thread, else 0."""
    policy = result.default_claim

    def claimed(k: int, record: KernelRecord) -> dict | None:
        if not record.kernel:
            return None
        yes = policy == "all" or (policy == "profitable" and record.profitable)
        return {"value": int(yes), "bgColor": CLAIMED if yes else NOT_CLAIMED}

    return _overlay(result, model, f"claimed by default ({policy})", claimed)


def time_overlay(result: FuseResult, profile: str | os.PathLike, model: Model | None = None) -> dict:
    """Each node of a profiled block valued by its block's mean time in microseconds, from the
    delegate's `profile` file (one JSON line per block: block, calls, total_us, mean_us; a block
    timed by several partitions or runs keeps its largest total)."""
    timed: dict[str, dict] = {}
    for line in Path(profile).read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            if entry["total_us"] >= timed.get(entry["block"], {"total_us": -1})["total_us"]:
                timed[entry["block"]] = entry
    overlay = _overlay(result, model, "block time, us (mean per call)",
                       lambda k, r: {"value": round(timed[r.block]["mean_us"], 3)} if r.block in timed else None)
    for graph in overlay.values():
        graph["gradient"] = [{"stop": 0, "bgColor": "#fff9c4"}, {"stop": 1, "bgColor": "#e53935"}]
    return overlay


def write_overlay(overlay: dict, path: str | os.PathLike) -> None:
    """Writes the overlay as Model Explorer's node data JSON (atomically)."""
    write_bytes_atomic(Path(path), json.dumps(overlay, indent=1).encode())
