"""Tensors LiteRT sizes only as the model runs (tflite_tools.model.shapes): no kernel touches them,
and a bundle of a model holding them lets LiteRT apply it (kTfLiteDelegateFlagsAllowDynamicTensors),
since without the flag LiteRT refuses the delegate and a model that runs in stock LiteRT would not
load (tests/test_delegate.py's never-worse test runs tests/models/run_time_shape.tflite)."""

from __future__ import annotations

import numpy as np

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
