"""Dynamic-range models (int8 weights, float activations): which ops quantize at run time, and the
tolerance `run --compare` holds their outputs to (tflite_tools/run.py): two correct
implementations of the same dynamic quantization meet it, a wrong answer does not."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tflite_tools
from tflite_tools import runtime
from tflite_tools.model.builder import ModelBuilder, quantization
from tflite_tools.model.hybrid import hybrid_depths, is_hybrid
from tflite_tools.run import HYBRID_STEPS, RTOL, compare, hybrid_rtol, reference_resolver

WIDTH = 48


def _dynamic_range_model(depth: int):
    """`depth` FULLY_CONNECTEDs with int8 weights (per-tensor scales) and float activations, each
    followed by a TANH and a residual ADD, as a dynamic-range encoder's layers are; beside them a
    float-only output and one FULLY_CONNECTED whose int8 weights are DEQUANTIZEd first (not hybrid)."""
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input("x", [4, WIDTH])
    h = x
    for k in range(depth):
        w = rng.integers(-127, 128, (WIDTH, WIDTH)).astype(np.int8)
        fc = b.op("FULLY_CONNECTED", [h, b.const(f"w{k}", w, quant=quantization(1.0 / (127 * math.sqrt(WIDTH)))),
                                      None], [4, WIDTH])
        h = b.op("ADD", [h, b.op("TANH", [fc], [4, WIDTH])], [4, WIDTH])
    stored = b.const("stored", rng.integers(-127, 128, (WIDTH, WIDTH)).astype(np.int8), quant=quantization(0.01))
    dense = b.op("DEQUANTIZE", [stored], [WIDTH, WIDTH], dtype="float32")
    b.output(h, b.op("RELU", [x], [4, WIDTH]), b.op("FULLY_CONNECTED", [x, dense, None], [4, WIDTH]))
    return b.build()


def test_hybrid_ops_are_those_reading_int8_weights_beside_float_activations():
    model = _dynamic_range_model(3)
    assert [op.name for op in model.main.operators if is_hybrid(op)] == ["FULLY_CONNECTED"] * 3
    assert hybrid_depths(model.main) == [3, 0, 0]


def test_tolerance_grows_with_the_square_root_of_the_depth():
    assert hybrid_rtol(0) == RTOL
    assert hybrid_rtol(48) == pytest.approx(math.sqrt(48) / HYBRID_STEPS)
    assert hybrid_rtol(1, rtol=0.5) == 0.5  # never below the float tolerance it starts from


@pytest.mark.parametrize("depth", [4, 16])
def test_stock_litert_meets_the_tolerance_and_a_wrong_answer_does_not(tmp_path, depth):
    # LiteRT + XNNPACK (asymmetric per-row quantization) and LiteRT's reference kernels (symmetric)
    # are two correct implementations: the rule passes both apart; 10 % off is caught.
    model = _dynamic_range_model(depth)
    path = tmp_path / "m.tflite"
    path.write_bytes(tflite_tools.serialize(model))
    stock = runtime.make_interpreter(path, "xnnpack", 1)
    inputs = runtime.random_inputs(stock, seed=3)
    got = runtime.run(stock, inputs)
    want = runtime.run(runtime.make_interpreter(path, reference_resolver(path), 1), inputs)
    rtols = [hybrid_rtol(d) for d in hybrid_depths(model.main)]
    errors = compare(got, want, ["h", "relu", "dequantized"], rtols)
    assert errors[0].max_rel > RTOL  # the two round differently: the float tolerance would fail stock
    assert all(e.ok for e in errors), errors
    assert not compare([got[0] * 1.1], [want[0]], ["h"], rtols[:1])[0].ok


def test_run_compare_judges_a_fused_dynamic_range_model_by_the_rule(tmp_path, private_cache):
    from delegate_checks import planned_nodes
    from tflite_tools.fuse import fuse
    from tflite_tools.model.reader import load
    from tflite_tools.run import run

    path = tmp_path / "m.tflite"
    path.write_bytes(tflite_tools.serialize(_dynamic_range_model(8)))
    result = fuse(path, tmp_path / "out", cache_dir=private_cache)
    outcome = run(result.model, result.library)
    assert outcome.ok, outcome.errors
    # Every node under the default policy, the hybrid FULLY_CONNECTEDs with the TANH / ADD between them.
    assert outcome.claims["claimed_nodes"] == planned_nodes(result) == list(range(len(load(result.model).main.operators)))
    deep, relu, dequantized = outcome.errors
    assert deep.rtol == hybrid_rtol(8) and deep.stock_max_abs is not None  # stock's error printed beside
    assert relu.rtol == dequantized.rtol == RTOL and relu.stock_max_abs is None


@pytest.mark.parametrize("target, claimed", [("host", True), ("host-int8-reference", True), ("arm64-linux", True),
                                             ("arm64-android", True), ("arm64-linux-nodot", False),
                                             ("host-opencl", False)])
def test_dynamic_range_blocks_are_claimed_by_default_where_measured_faster(target, claimed):
    # x86 (time: bench/RESULTS.md "Real-size corpus: speed") and ARMv8.2 (instructions: "ARM64:
    # dynamic-range models") beat XNNPACK's own dynamic quantization on whole models; ARMv8.0
    # cores were not measured, and GPU blocks are never claimed unmeasured.
    from halide_gen.targets import target_spec

    ops = _dynamic_range_model(1).main.operators
    assert target_spec(target).claims_unmeasured(ops[:3]) == claimed
    assert target_spec(target).claims_unmeasured(ops[4:5]) == (target_spec(target).family != "gpu")  # the RELU
