"""What `fuse -o` draws: Model Explorer overlays that load in its node-data format and land on the
nodes Model Explorer's own TFLite adapter shows for the fused model (every signature), the block
times from the delegate's profile, and plan.svg."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from model_explorer.builtin_tflite_flatbuffer_adapter import BuiltinTfliteFlatbufferAdapter
from model_explorer.node_data_builder import GraphNodeData, NodeDataResult

from tflite_tools import runtime
from tflite_tools.explorer import time_overlay
from tflite_tools.fuse import EXPLORER


def _graph_nodes(model) -> dict[str, set[str]]:
    """Model Explorer's graphs of a TFLite file: graph id -> node ids."""
    collections = BuiltinTfliteFlatbufferAdapter().convert(str(model), {})["graphCollections"]
    return {g["id"]: {n["id"] for n in g["nodes"]} for c in collections for g in c.graphs}


def _loaded(overlay: dict) -> dict[str, GraphNodeData]:
    """The overlay as ai-edge-model-explorer's node-data classes read it."""
    return {graph: GraphNodeData(results={k: NodeDataResult(**v) for k, v in data["results"].items()},
                                 **{k: v for k, v in data.items() if k != "results"})
            for graph, data in overlay.items()}


@pytest.mark.parametrize("stem", ["unet_tiny", "tiny_gemma_decoder"])
def test_the_overlays_land_on_every_claimable_node_model_explorer_shows(stem, fused):
    result = fused(stem)
    graphs = _graph_nodes(result.model)
    blocks = _loaded(json.loads((result.out / EXPLORER / "blocks.json").read_text()))
    claims = _loaded(json.loads((result.out / EXPLORER / "claims.json").read_text()))
    assert set(blocks) == set(claims) == set(graphs)  # every subgraph, under Model Explorer's ids
    for graph, data in blocks.items():
        assert set(data.results) <= graphs[graph]
        assert set(claims[graph].results) == set(data.results)
    kernel_nodes = sum(len(k.nodes) for k in result.kernels if k.kernel and k.shapes is None)
    assert sum(len(d.results) for d in blocks.values()) == kernel_nodes
    assert {r.value for d in claims.values() for r in d.results.values()} == {1}  # all claimed by default here


def test_the_time_overlay_gives_each_profiled_block_its_time(fused, tmp_path):
    result = fused("unet_tiny")
    profile = tmp_path / "profile.jsonl"
    d = runtime.load_delegate(str(result.library), options={"claim": "all", "profile": str(profile)})
    interp = runtime.make_interpreter(result.model, delegates=[d])
    runtime.run(interp, runtime.random_inputs(interp))
    del interp, d  # the profile is written when the partitions are freed
    timed = {json.loads(line)["block"] for line in profile.read_text().splitlines()}
    overlay = _loaded(time_overlay(result, profile))["main"]
    assert overlay.gradient and all(r.value > 0 for r in overlay.results.values())
    assert len(overlay.results) == sum(len(k.nodes) for k in result.kernels if k.block in timed)


def test_fuse_draws_the_plan_as_svg_where_graphviz_is_installed(fused):
    if shutil.which("dot") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Graphviz is required in CI (scripts/install-system-deps.sh)")
        pytest.skip("needs Graphviz")
    result = fused("unet_tiny")
    svg = (result.out / "plan.svg").read_text()
    assert svg.startswith("<?xml") and "<svg" in svg
    assert any(f">{k.block} (" in svg for k in result.kernels)  # a fused block's cluster label
