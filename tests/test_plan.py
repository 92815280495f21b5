"""The fusion planner on hand-built graphs: every Table 3 cell, convexity, multiple consumers."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tflite_tools
from fusion.cost import CachedCost, RooflineCost
from fusion.ecg import build_ecg
from fusion.mapping import REORG, SHUFFLE, MappingType, MtM, OtM, OtO
from fusion.plan import PlanConfig, plan_fusion
from fusion.table3 import Color, cell
from graphgen import attention_ops, layer_norm_ops
from tflite_tools.model.builder import ModelBuilder


class FixedCost:
    """A cost source that makes every yellow cell profitable (or never)."""

    def __init__(self, fuse: bool):
        self.name = f"fixed-{fuse}"
        self.fuse = fuse
        self.asked = 0

    def latency(self, ecg, ops):
        self.asked += 1
        return 1.0 if self.fuse else float(len(ops)) ** 2


# One op per mapping type, each taking a [4, 6] float tensor.
def _oto(b, x):
    return b.op("RELU", [x], x.shape)


def _otm(b, x):
    return b.op("TILE", [x, b.const("m", np.array([1, 2], np.int32))], [x.shape[0], 2 * x.shape[1]])


def _mtm(b, x):
    return b.op("SOFTMAX", [x], x.shape, beta=1.0)


def _reorg(b, x):
    return b.op("RESHAPE", [x, b.const("s", np.array([x.shape[1], x.shape[0]], np.int32))],
                [x.shape[1], x.shape[0]], new_shape=[x.shape[1], x.shape[0]])


def _shuffle(b, x):
    return b.op("TRANSPOSE", [x, b.const("p", np.array([1, 0], np.int32))], [x.shape[1], x.shape[0]])


MAKERS = {OtO: _oto, OtM: _otm, MtM: _mtm, REORG: _reorg, SHUFFLE: _shuffle}


def pair_plan(first: MappingType, second: MappingType, cost):
    b = ModelBuilder()
    x = b.input("x", [4, 6])
    b.output(MAKERS[second](b, MAKERS[first](b, x)))
    ecg = build_ecg(b.build().main)
    assert [n.mapping for n in ecg.nodes] == [first, second]
    return plan_fusion(ecg, cost)


@pytest.mark.parametrize("first", list(MappingType), ids=lambda t: t.short)
@pytest.mark.parametrize("second", list(MappingType), ids=lambda t: t.short)
def test_every_table3_cell(first, second):
    c = cell(first, second)
    for fuse in (True, False):
        cost = FixedCost(fuse)
        plan = pair_plan(first, second, cost)
        fused = len(plan.blocks) == 1
        if c.color is Color.RED:
            assert not fused and cost.asked == 0
        elif c.color is Color.GREEN:
            assert fused and cost.asked == 0
            assert plan.blocks[0].mapping == c.fused
        else:
            assert fused == fuse and cost.asked > 0
            if fused:
                assert plan.blocks[0].mapping == c.fused


def test_paper_figure_3():
    # GEMM -> Add (seed) -> Conv -> Relu -> Mul -> Sub. In the paper's order the seed absorbs its
    # successors; going backwards it meets GEMM, and Many-to-Many after Many-to-Many is red. With
    # epilogues first (the default) the Add joins the GEMM, and the Conv seeds a block of its own.
    b = ModelBuilder()
    x, y, z = b.input("x", [1, 4, 4, 8]), b.input("y", [1, 4, 4, 8]), b.input("z", [1, 4, 4, 8])
    gemm = b.op("FULLY_CONNECTED", [x, b.const("w", np.ones([8, 8], np.float32)), None], [1, 4, 4, 8],
                keep_num_dims=True)
    add = b.op("ADD", [gemm, y], [1, 4, 4, 8])
    conv = b.op("CONV_2D", [add, b.const("k", np.ones([8, 3, 3, 8], np.float32)), b.const("c", np.zeros(8, np.float32))],
                [1, 4, 4, 8], padding="SAME", stride_h=1, stride_w=1)
    relu = b.op("RELU", [conv], [1, 4, 4, 8])
    mul = b.op("MUL", [relu, z], [1, 4, 4, 8])
    b.output(b.op("SUB", [mul, y], [1, 4, 4, 8]))
    ecg = build_ecg(b.build().main)
    plan = plan_fusion(ecg, FixedCost(True), PlanConfig(epilogue_first=False))
    assert [b.ops for b in plan.blocks] == [(0,), (1, 2, 3, 4, 5)]
    assert plan.blocks[1].mapping == MtM
    plan = plan_fusion(ecg, FixedCost(True))
    assert [b.ops for b in plan.blocks] == [(0, 1), (2, 3, 4, 5)]
    assert [b.mapping for b in plan.blocks] == [MtM, MtM]


def test_convexity_around_an_opaque_op():
    # RELU -> custom -> ADD(RELU, custom): RELU and ADD alone would leave and re-enter the block.
    b = ModelBuilder()
    x = b.input("x", [8])
    r = b.op("RELU", [x], [8])
    c = b.custom("Opaque", [r], [8])
    b.output(b.op("ADD", [r, c], [8]))
    plan = plan_fusion(build_ecg(b.build().main), FixedCost(True))
    assert [b.ops for b in plan.blocks] == [(0,), (1,), (2,)]
    assert plan.blocks[1].opaque_reason == "custom op Opaque"


def test_no_cycle_between_blocks():
    # p -> s, q -> s, p -> r, q -> r. With two ops per block, {p, s} forms first; {q, r} would
    # need s's block before it and feed it at the same time, so it must not form.
    b = ModelBuilder()
    x, y = b.input("x", [8]), b.input("y", [8])
    p, q = b.op("RELU", [x], [8]), b.op("RELU", [y], [8])
    s = b.op("ADD", [p, q], [8])
    r = b.op("SUB", [q, p], [8])
    b.output(s, r)
    plan = plan_fusion(build_ecg(b.build().main), FixedCost(True), PlanConfig(max_ops=2))
    assert sorted(b.ops for b in plan.blocks) == [(0, 2), (1,), (3,)]
    position = {i: k for k, blk in enumerate(plan.blocks) for i in blk.ops}
    for blk in plan.blocks:  # every block runs after the blocks it reads from
        for i in blk.ops:
            for pred in plan.ecg.predecessors(i):
                assert position[pred] <= position[i]


def test_intermediate_with_unfused_consumer_stays_an_output():
    b = ModelBuilder()
    x = b.input("x", [8])
    t = b.op("RELU", [x], [8])
    u = b.op("TANH", [t], [8])
    v = b.custom("Opaque", [t], [8])
    b.output(u, v)
    plan = plan_fusion(build_ecg(b.build().main), FixedCost(True))
    fused = next(blk for blk in plan.blocks if blk.fused)
    assert fused.ops == (0, 1)
    assert t in fused.outputs and u in fused.outputs and fused.removable == []


def test_single_consumer_intermediate_is_removed(model_path):
    plan = plan_fusion(build_ecg(tflite_tools.load(model_path("swish_chain")).main), FixedCost(True))
    (block,) = plan.blocks
    assert block.ops == (0, 1, 2, 3) and len(block.removable) == 3 and len(block.outputs) == 1


def test_constraints_bound_block_size():
    b = ModelBuilder()
    t = b.input("x", [8])
    for _ in range(10):
        t = b.op("RELU", [t], [8])
    b.output(t)
    plan = plan_fusion(build_ecg(b.build().main), FixedCost(True), PlanConfig(max_ops=4))
    assert [len(blk.ops) for blk in plan.blocks] == [4, 4, 2]


def test_inverted_residual_exception(model_path):
    # The measured exception to Table 3: expand 1x1 -> depthwise -> project 1x1 (+ residual).
    ecg = build_ecg(tflite_tools.load(model_path("mobilenet_v2_035_96")).main)
    plan = plan_fusion(ecg, RooflineCost())
    names = [[ecg.nodes[i].name for i in blk.ops] for blk in plan.blocks]
    assert ["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D"] in names
    for blk in plan.blocks:  # never two depthwise convs, never a 3x3 conv chained to another MtM
        assert sum(ecg.nodes[i].name == "DEPTHWISE_CONV_2D" for i in blk.ops) <= 1


def test_plan_is_deterministic(model_path):
    def run():
        plan = plan_fusion(build_ecg(tflite_tools.load(model_path("transformer_encoder")).main), RooflineCost())
        return [(blk.name, blk.ops, blk.signature) for blk in plan.blocks]

    assert run() == run()


def test_repeated_blocks_share_a_signature(model_path):
    plan = plan_fusion(build_ecg(tflite_tools.load(model_path("transformer_encoder")).main), RooflineCost())
    signatures = [blk.signature for blk in plan.blocks]
    assert len(set(signatures)) < len(signatures)  # the LayerNorms repeat


def test_cost_cache_on_disk(tmp_path, model_path):
    ecg = build_ecg(tflite_tools.load(model_path("transformer_encoder")).main)
    first = CachedCost(RooflineCost(), tmp_path)
    plan_fusion(ecg, first)
    first.save()
    assert first.misses > 0
    table = json.loads((tmp_path / "cost-roofline-v1.json").read_text())
    assert len(table) == first.misses
    second = CachedCost(RooflineCost(), tmp_path)
    plan_fusion(ecg, second)
    assert second.misses == 0 and second.hits == first.misses + first.hits


def test_corrupt_cost_cache_is_ignored(tmp_path, model_path):
    (tmp_path / "cost-roofline-v1.json").write_text("{not json")
    cost = CachedCost(RooflineCost(), tmp_path)
    plan_fusion(build_ecg(tflite_tools.load(model_path("transformer_encoder")).main), cost)
    cost.save()
    assert json.loads((tmp_path / "cost-roofline-v1.json").read_text())


def _ln_plan(cost):
    b = ModelBuilder()
    x = b.input("x", [1, 8, 32])
    b.output(layer_norm_ops(b, b.op("RELU", [x], [1, 8, 32]), np.linspace(0.5, 1.5, 32), np.linspace(-1, 1, 32), 1e-5))
    ecg = build_ecg(b.build().main)
    return ecg, plan_fusion(ecg, cost)


def test_layer_norm_reductions_fuse_into_one_block(model_path):
    # Past Table 3's red Many-to-Many cell: reductions over the innermost axis of the same rows (the
    # two MEANs of a LayerNorm) and the broadcasts between them are one block, asked of the cost source.
    cost = FixedCost(True)
    ecg, plan = _ln_plan(cost)
    assert len(plan.blocks) == 1 and len(plan.blocks[0].ops) == len(ecg.nodes)
    assert cost.asked > 0
    # The same in the converter's transformer: every LayerNorm is one block with both its MEANs.
    ecg = build_ecg(tflite_tools.load(model_path("transformer_encoder")).main)
    plan = plan_fusion(ecg, RooflineCost())
    means = [sum(ecg.nodes[i].name == "MEAN" for i in blk.ops) for blk in plan.blocks]
    assert means.count(2) >= 2 and 1 not in means


def test_the_cost_source_can_veto_fusing_row_reductions():
    ecg, plan = _ln_plan(FixedCost(False))
    assert all(sum(ecg.nodes[i].name == "MEAN" for i in blk.ops) <= 1 for blk in plan.blocks)


def test_reductions_of_other_axes_or_rows_stay_apart():
    from fusion.table3 import row_reductions_allowed

    b = ModelBuilder()
    x = b.input("x", [1, 8, 32])
    rows = b.op("MEAN", [x, b.const("a", np.array([2], np.int32))], [1, 8, 1], keep_dims=True)
    centred = b.op("SUB", [x, rows], [1, 8, 32])
    columns = b.op("MEAN", [centred, b.const("c", np.array([1], np.int32))], [1, 1, 32], keep_dims=True)  # not rows
    tiled = b.op("TILE", [centred, b.const("m", np.array([1, 1, 2], np.int32))], [1, 8, 64])  # not a broadcast
    wide = b.op("SUM", [tiled, b.const("w", np.array([2], np.int32))], [1, 8, 1], keep_dims=True)
    b.output(columns)
    b.output(wide)
    ecg = build_ecg(b.build().main)
    mean_rows, sub, mean_columns, tile, total = range(5)
    assert row_reductions_allowed(ecg, {mean_rows}, sub)  # x - mean: a value per row
    assert not row_reductions_allowed(ecg, {mean_rows, sub}, mean_columns)  # another axis
    assert not row_reductions_allowed(ecg, {mean_rows, sub}, tile)  # not a broadcast onto the rows
    assert not row_reductions_allowed(ecg, {mean_rows, sub, tile}, total)  # rows of 64 beside rows of 32


def _attention_model(rows: int = 16):
    """Two heads of causal attention on [1, 2, rows, 8] queries, keys and values."""
    b = ModelBuilder()
    q, k, v = (b.input(n, [1, 2, rows, 8]) for n in "qkv")
    b.output(attention_ops(b, q, k, v, np.triu(np.full((rows, rows), -1e9, np.float32), 1)[None, None]))
    return b.build()


def test_the_attention_core_fuses_into_one_block(model_path):
    # Past Table 3's red Many-to-Many cell: scores, scale, mask, softmax and weights x values are one
    # block, asked of the cost source.
    cost = FixedCost(True)
    ecg = build_ecg(_attention_model().main)
    plan = plan_fusion(ecg, cost)
    assert len(plan.blocks) == 1 and len(plan.blocks[0].ops) == len(ecg.nodes)
    assert cost.asked > 0
    # The converter's transformer: its attention core, with the heads' reshapes and transposes, is one block.
    ecg = build_ecg(tflite_tools.load(model_path("transformer_encoder")).main)
    plan = plan_fusion(ecg, RooflineCost())
    cores = [blk for blk in plan.blocks if any(ecg.nodes[i].name == "SOFTMAX" for i in blk.ops)]
    assert cores and all(sum(ecg.nodes[i].name == "BATCH_MATMUL" for i in blk.ops) == 2 for blk in cores)


@pytest.mark.parametrize("cost, config", [(FixedCost(False), PlanConfig()),
                                          (FixedCost(True), PlanConfig(attention_core=False))])
def test_the_cost_source_or_a_gpu_target_keeps_the_attention_core_apart(cost, config):
    # A GPU target plans with attention_core off (TargetSpec.plan_config): each stage is a launch there
    # either way.
    ecg = build_ecg(_attention_model().main)
    plan = plan_fusion(ecg, cost, config)
    for blk in plan.blocks:
        names = [ecg.nodes[i].name for i in blk.ops]
        assert names.count("BATCH_MATMUL") + names.count("SOFTMAX") <= 1, names


def test_only_an_attention_core_passes_the_red_cell():
    from fusion.table3 import attention_allowed

    b = ModelBuilder()
    q, k, v = (b.input(n, [1, 2, 16, 8]) for n in "qkv")
    scores = b.op("BATCH_MATMUL", [q, k], [1, 2, 16, 16], adj_y=True)
    weights = b.op("SOFTMAX", [scores], scores.shape, beta=1.0)
    out = b.op("BATCH_MATMUL", [weights, v], [1, 2, 16, 8])
    turned = b.op("BATCH_MATMUL", [weights, q], [1, 2, 16, 8], adj_x=True)  # the weights transposed
    again = b.op("SOFTMAX", [out], out.shape, beta=1.0)  # a second softmax
    fc = b.op("FULLY_CONNECTED", [out, b.const("w", np.ones((4, 8), np.float32))], [1, 2, 16, 4])
    for t in (turned, again, fc):
        b.output(t)
    ecg = build_ecg(b.build().main)
    product, softmax, weighted, transposed, second, dense = range(6)
    assert attention_allowed(ecg, {softmax}, product)  # the scores
    assert attention_allowed(ecg, {product, softmax}, weighted)  # weights x values
    assert not attention_allowed(ecg, {product, softmax}, transposed)  # left operand transposed
    assert not attention_allowed(ecg, {product, softmax, weighted}, second)
    assert not attention_allowed(ecg, {product, softmax, weighted}, dense)
    assert not attention_allowed(ecg, {weighted}, product)  # no softmax between: not attention


def _block_ops(plan) -> list[list[str]]:
    return [[plan.ecg.nodes[i].name for i in blk.ops] for blk in plan.blocks]


def _between_two_products(middle: str):
    """FC -> `middle` (an activation, or a residual ADD of the first FC's input) -> FC."""
    rng = np.random.default_rng(4)
    b = ModelBuilder()
    x = b.input("x", [1, 8, 16])
    h = b.op("FULLY_CONNECTED", [x, b.const("w1", rng.standard_normal((16, 16)).astype(np.float32)),
                                 b.const("b1", rng.standard_normal(16).astype(np.float32))], [1, 8, 16], keep_num_dims=True)
    a = b.op("GELU", [h], h.shape, approximate=False) if middle == "GELU" else b.op("ADD", [h, x], h.shape)
    b.output(b.op("FULLY_CONNECTED", [a, b.const("w2", rng.standard_normal((8, 16)).astype(np.float32)), None],
                  [1, 8, 8], keep_num_dims=True))
    return b.build()


@pytest.mark.parametrize("middle", ["GELU", "ADD"])
def test_an_elementwise_op_between_two_products_is_the_first_ones_epilogue(middle):
    # Both Table 3 cells are green; growing the elementwise seed into its producer first computes it
    # on the producer's register tile, where the consumer's block would materialise it before its
    # reduction (bert's FC -> GELU -> FC). The paper's order, successors first, stays a config.
    ecg = build_ecg(_between_two_products(middle).main)
    assert _block_ops(plan_fusion(ecg, FixedCost(True))) == [["FULLY_CONNECTED", middle], ["FULLY_CONNECTED"]]
    paper = plan_fusion(ecg, FixedCost(True), PlanConfig(epilogue_first=False))
    assert _block_ops(paper) == [["FULLY_CONNECTED"], [middle, "FULLY_CONNECTED"]]


@pytest.mark.parametrize("target, attention_core, epilogue_first", [
    ("host", True, True), ("arm64-linux", True, False), ("arm64-android", True, False),
    ("host-opencl", False, True), ("arm64-android-vulkan", False, True)])
def test_each_target_family_plans_with_its_own_settings(target, attention_core, epilogue_first):
    # NEON keeps the paper's order: an epilogue's constants do not fit beside its register tile
    # (efficientnet_b0's ARM64 instructions 0.883x -> 0.920x XNNPACK's with epilogues first).
    from halide_gen.targets import target_spec

    config = target_spec(target).plan_config()
    assert (config.attention_core, config.epilogue_first) == (attention_core, epilogue_first)


@pytest.mark.parametrize("middle", ["GELU", "ADD"])
def test_a_product_with_an_elementwise_epilogue_matches_litert(middle):
    from blockcheck import check_model_blocks

    assert sum(check_model_blocks(_between_two_products(middle)).values()) == 2


def test_data_movement_keeps_the_consumers_block():
    # A CONCATENATION after a convolution is read in place by the convolution that consumes it
    # (unet_small's decoder): it is no epilogue, so it grows along its successors first.
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 4])

    def conv(t, cout, name):
        return b.op("CONV_2D", [t, b.const(f"w{name}", rng.standard_normal((cout, 3, 3, t.shape[-1])).astype(np.float32)),
                                b.const(f"b{name}", np.zeros(cout, np.float32))], [1, 6, 6, cout],
                    padding="SAME", stride_h=1, stride_w=1)

    joined = b.op("CONCATENATION", [conv(x, 4, "1"), x], [1, 6, 6, 8], axis=3)
    b.output(conv(joined, 4, "2"))
    assert _block_ops(plan_fusion(build_ecg(b.build().main), FixedCost(True))) == [["CONV_2D"], ["CONCATENATION", "CONV_2D"]]


def test_a_video_cnns_3d_convolutions_take_their_activations_in():
    # C3D converts as CONV_3D then a RELU op of its own (and a 3-D U-Net's CONV_3D_TRANSPOSE too):
    # each RELU joins a convolution's block, so the model runs in one kernel per convolution, not
    # one more per activation.
    from conftest import MODELS
    from halide_gen.block import build_block

    model = tflite_tools.load(MODELS / "video_cnn.tflite")
    plan = plan_fusion(build_ecg(model.main))
    blocks = [[plan.ecg.nodes[i].op.name for i in b.ops] for b in plan.blocks]
    assert len(blocks) == 3 and all(names.count("CONV_3D") + names.count("CONV_3D_TRANSPOSE") == 1 for names in blocks)
    assert sum(names.count("RELU") for names in blocks) == 3
    for b in plan.blocks:  # and each block lowers: CONV_3D has a mapping type and a lowering
        build_block(b.name, [plan.ecg.nodes[i].op for i in b.ops], b.outputs)
