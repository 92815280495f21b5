"""Mapping types, Table 3 and the ECG annotations."""

from __future__ import annotations

import numpy as np
import pytest

import tflite_tools
from fusion.ecg import build_ecg
from fusion.mapping import OPS, REORG, SHUFFLE, MappingType, MtM, OtM, OtO, Prop, op_mapping
from fusion.rewrite import rewrite
from fusion.table3 import TABLE3, Color, cell
from tflite_tools.model.builder import ModelBuilder
from conftest import project_model_paths, shared_model_paths

ISSUE_OPS = """ADD SUB MUL DIV MAXIMUM MINIMUM POW SQUARED_DIFFERENCE RELU RELU6 RELU_N1_TO_1 LEAKY_RELU PRELU
LOGISTIC TANH HARD_SWISH GELU EXP LOG SQRT RSQRT SQUARE ABS NEG SIN COS FLOOR CEIL ROUND CAST QUANTIZE
DEQUANTIZE SELECT SELECT_V2 LESS LESS_EQUAL GREATER GREATER_EQUAL EQUAL NOT_EQUAL LOGICAL_AND LOGICAL_OR
LOGICAL_NOT CONCATENATION SLICE STRIDED_SLICE SPLIT SPLIT_V PACK UNPACK PAD PADV2 MIRROR_PAD BROADCAST_TO
TILE GATHER GATHER_ND RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR CONV_2D DEPTHWISE_CONV_2D TRANSPOSE_CONV
FULLY_CONNECTED BATCH_MATMUL AVERAGE_POOL_2D MAX_POOL_2D MEAN SUM REDUCE_MAX REDUCE_MIN REDUCE_PROD SOFTMAX
LOG_SOFTMAX L2_NORMALIZATION ARG_MAX ARG_MIN RESHAPE SQUEEZE EXPAND_DIMS TRANSPOSE DEPTH_TO_SPACE
SPACE_TO_DEPTH""".split()


def test_every_required_op_has_a_mapping_type():
    assert sorted(set(ISSUE_OPS) - set(OPS)) == []



def test_the_elementwise_ops_are_exactly_those_lowered_as_elementwise():
    # One definition (fusion.mapping.ELEMENTWISE) that the planner's per-edge types and the
    # schedules' epilogues both read: every op in it has its float lowering in lower/elementwise.py
    # (reading each input at its own index), and that module lowers no other op.
    from fusion.mapping import ELEMENTWISE
    from halide_gen.lower import LOWERINGS

    assert ELEMENTWISE == {name for name, fn in LOWERINGS.items() if fn.__module__ == "halide_gen.lower.elementwise"}

@pytest.mark.parametrize(
    "op, expected",
    [("ADD", OtO), ("CONCATENATION", OtO), ("SLICE", OtO), ("SPLIT", OtO), ("PAD", OtO), ("MIRROR_PAD", OtM),
     ("GATHER", OtM), ("RESIZE_BILINEAR", OtM), ("CONV_2D", MtM), ("SOFTMAX", MtM), ("MEAN", MtM),
     ("RESHAPE", REORG), ("SQUEEZE", REORG), ("TRANSPOSE", SHUFFLE), ("DEPTH_TO_SPACE", SHUFFLE)],
)
def test_representative_types(op, expected):
    assert OPS[op].mapping == expected


def test_properties():
    assert OPS["ADD"].props == Prop.ASSOCIATIVE | Prop.COMMUTATIVE
    assert Prop.DISTRIBUTIVE in OPS["MUL"].props
    assert OPS["RESHAPE"].props == Prop.NONE and OPS["CONV_2D"].props == Prop.NONE


def test_builtins_in_every_model_are_classified_or_opaque():
    # After rewriting (which folds DENSIFY of constant weights away), every builtin has a type
    # except control flow and SHAPE (it reads no element: LiteRT computes it when it prepares the
    # model); custom ops are opaque.
    paths = project_model_paths() + shared_model_paths()
    for path in paths:
        model = tflite_tools.load(path)
        rewrite(model)
        for _, op in model.operators():
            if op.opcode.is_custom or op.name in ("WHILE", "IF", "SHAPE"):
                assert op_mapping(op) is None
            else:
                assert op_mapping(op) is not None, f"{path.name}: {op.name}"


def _binary(shape_a, shape_b, const_b=False):
    b = ModelBuilder()
    x = b.input("x", shape_a)
    y = b.const("y", np.ones(shape_b, np.float32)) if const_b else b.input("y", shape_b)
    out_shape = np.broadcast_shapes(tuple(shape_a), tuple(shape_b))
    b.output(b.op("ADD", [x, y], out_shape))
    return build_ecg(b.build().main).nodes[0]


def test_per_edge_classification():
    same = _binary([1, 4, 4, 8], [1, 4, 4, 8])
    assert same.edges == [OtO, OtO] and same.mapping == OtO
    # A broadcast non-constant operand is One-to-Many (x - mean in LayerNorm)...
    broadcast = _binary([1, 4, 4, 8], [1, 1, 1, 8])
    assert broadcast.edges == [OtO, OtM] and broadcast.mapping == OtM
    # ...but a constant or a scalar broadcast counts as One-to-One (the stated deviation).
    assert _binary([1, 4, 4, 8], [8], const_b=True).mapping == OtO
    assert _binary([1, 4, 4, 8], [1], const_b=False).mapping == OtO


def test_strided_slice_with_shrink_mask_is_reorganize():
    b = ModelBuilder()
    x = b.input("x", [1, 4, 6])
    begin, end, strides = (b.const(n, np.array(v, np.int32)) for n, v in
                           (("b", [0, 1, 0]), ("e", [1, 2, 6]), ("s", [1, 1, 1])))
    plain = b.op("STRIDED_SLICE", [x, begin, end, strides], [1, 1, 6])
    shrunk = b.op("STRIDED_SLICE", [x, begin, end, strides], [6], shrink_axis_mask=3)
    b.output(plain, shrunk)
    nodes = build_ecg(b.build().main).nodes
    assert [n.mapping for n in nodes] == [OtO, REORG]


def test_opaque_nodes_say_why(model_path):
    ecg = build_ecg(tflite_tools.load(model_path("custom_op")).main)
    assert "custom op DnnfTestCustom" in ecg.nodes[0].opaque_reason
    assert ecg.nodes[1].fusible
    ecg = build_ecg(tflite_tools.load(model_path("dynamic_batch")).main)
    assert ecg.nodes[0].fusible  # an open batch is fused at the prepared shape
    ecg = build_ecg(tflite_tools.load(model_path("run_time_shape")).main)
    assert any("is sized only when the model runs" in (n.opaque_reason or "") for n in ecg.nodes)
    ecg = build_ecg(tflite_tools.load(model_path("while_loop")).main)
    assert "WHILE has no mapping type" in ecg.nodes[0].opaque_reason


def test_ecg_intermediate_sizes_and_removability(model_path):
    ecg = build_ecg(tflite_tools.load(model_path("swish_chain")).main)
    assert [ecg.irs_bytes(i) for i in range(4)] == [800] * 4
    t = ecg.nodes[1].op.outputs[0]  # read by LOGISTIC and the last MUL
    assert ecg.ir_removable(t, {1, 2, 3})
    assert not ecg.ir_removable(t, {1, 2})
    assert not ecg.ir_removable(ecg.nodes[3].op.outputs[0], {0, 1, 2, 3})  # a graph output


def test_table3_has_23_fusible_cells_and_two_red():
    assert len(TABLE3) == 25
    red = sorted((a.short, b.short) for (a, b), c in TABLE3.items() if c.color is Color.RED)
    assert red == [("MtM", "MtM"), ("OtM", "MtM")]
    for t in MappingType:
        assert cell(OtO, t).color is Color.GREEN and cell(t, OtO).color is Color.GREEN


def test_table3_types_follow_impedance():
    assert cell(OtO, MtM).fused == MtM and cell(MtM, OtO).fused == MtM
    assert cell(REORG, SHUFFLE).fused == REORG and cell(SHUFFLE, REORG).fused == REORG
    assert cell(SHUFFLE, OtM).fused == OtM and cell(MtM, REORG).fused == MtM
    assert cell(OtM, OtM).color is Color.YELLOW and cell(REORG, REORG).color is Color.GREEN
