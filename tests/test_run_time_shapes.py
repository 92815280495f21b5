"""Tensors LiteRT sizes only as the model runs (tflite_tools.model.shapes): no kernel touches them,
and a bundle of a model holding them lets LiteRT apply it (kTfLiteDelegateFlagsAllowDynamicTensors),
since without the flag LiteRT refuses the delegate and a model that runs in stock LiteRT would not
load (tests/test_delegate.py's never-worse test runs tests/models/run_time_shape.tflite)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tflite_tools

from fusion.ecg import build_ecg
from tflite_tools.model.builder import ModelBuilder
from tflite_tools.model.shapes import sized_at_run_time


def _graph():
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 3])
    n = b.input("n", [], "int32")
    shape = b.op("SHAPE", [x], [4], dtype="int32")
    fixed = b.op("RESHAPE", [x, b.const("to", np.array([1, 48], np.int32))], [1, 48])
    computed = b.op("RESHAPE", [x, shape], [1, 4, 4, 3])
    limit = b.op("RANGE", [b.const("s", np.array(0, np.int32)), n, b.const("d", np.array(1, np.int32))], [1])
    after = b.op("ADD", [limit, limit], [1])
    b.output(fixed, computed, after)
    return b.build().main, dict(shape=shape, fixed=fixed, computed=computed, limit=limit, after=after)


def test_shapes_computed_from_values_are_sized_as_the_model_runs_and_so_is_what_reads_them():
    sg, t = _graph()
    dynamic = sized_at_run_time(sg.operators)
    assert {name for name, tensor in t.items() if id(tensor) in dynamic} == {"computed", "limit", "after"}


def test_ops_touching_them_stay_with_tflite():
    sg, _ = _graph()
    reasons = {n.op.name + str(n.index): n.opaque_reason for n in build_ecg(sg).nodes}
    assert reasons["RESHAPE1"] is None  # a constant shape
    assert "sized only when the model runs" in reasons["RESHAPE2"]
    assert "sized only when the model runs" in reasons["ADD4"]


def test_a_tensor_of_no_elements_stays_with_tflite():
    b = ModelBuilder()
    x = b.input("x", [1, 0, 4])
    b.output(b.op("RELU", [x], [1, 0, 4]))
    (node,) = build_ecg(b.build().main).nodes
    assert node.opaque_reason == "'x' holds no elements"


def _conv_model_with_a_run_time_shape(path):
    """Two convolutions and a residual ADD (one block: kernels with internal tensors, and TFLite
    kernels with temporaries) beside a TILE LiteRT sizes only as the model runs."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 3])
    v, n = b.input("v", [2]), b.input("n", [1], "int32")
    first = b.op("CONV_2D", [x, b.const("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
                             b.const("b1", rng.standard_normal(8).astype(np.float32))], [1, 8, 8, 8],
                 padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU")
    second = b.op("CONV_2D", [first, b.const("w2", rng.standard_normal((8, 3, 3, 8)).astype(np.float32)),
                              b.const("b2", rng.standard_normal(8).astype(np.float32))], [1, 8, 8, 8],
                  padding="SAME", stride_h=1, stride_w=1)
    tiled = b.op("TILE", [v, n], [2])
    tiled.shape_signature = (-1,)
    b.output(b.op("ADD", [first, second], [1, 8, 8, 8]), tiled)
    path.write_bytes(tflite_tools.serialize(b.build()))
    return path


@pytest.mark.parametrize("claim", ["all", None, "none"])
def test_a_resized_input_runs_through_tflites_kernels_and_back(claim, tmp_path, private_cache):
    # A bundle that allows dynamic tensors stays in the graph across a resize (TFLite re-prepares
    # the partition instead of claiming again): the partition runs TFLite's kernels for its nodes
    # at the new shape, and its own again once the shape is back.
    from tflite_tools import runtime
    from tflite_tools.fuse import fuse
    from tflite_tools.run import compare, reference_resolver

    result = fuse(_conv_model_with_a_run_time_shape(tmp_path / "m.tflite"), tmp_path / "out",
                  cache_dir=private_cache)
    report = tmp_path / "claims.jsonl"
    options = {"report": str(report), **({"claim": claim} if claim else {})}
    interp = runtime.make_interpreter(result.model, delegates=[runtime.load_delegate(str(result.library), options)])
    reference = runtime.make_interpreter(result.model, reference_resolver(result.model))
    for shape in ([2, 12, 10, 3], [1, 8, 8, 3], [3, 5, 9, 3]):
        for it in (interp, reference):
            it.resize_tensor_input(it.get_input_details()[0]["index"], shape)
            it.allocate_tensors()
        inputs = runtime.random_inputs(interp, seed=sum(shape))
        got, want = runtime.run(interp, inputs), runtime.run(reference, inputs)
        assert got[0].shape == tuple(shape[:3]) + (8,)
        assert all(e.ok for e in compare(got, want, ["sum", "tiled"])), shape
    claimed = json.loads(report.read_text().splitlines()[-1])["claimed_nodes"]
    assert len(claimed) == (0 if claim == "none" else 3)
