"""Every rewrite rule, run through LiteRT before and after.

Exact rules must give bit-identical outputs under TFLite's reference kernels. Fast-math rules
change rounding; they must stay within FAST_MATH_TOLERANCE: max |after - before| <= 1e-5 x
max |before| (about 80 float32 ulps of the output's scale — generous for one reassociation,
tight enough to catch a wrong rewrite).
"""

from __future__ import annotations

import numpy as np
import pytest

import tflite_tools
from fusion.rewrite import RULES, active_rules, rewrite
from tflite_tools import runtime
from tflite_tools.model.builder import ModelBuilder

FAST_MATH_TOLERANCE = 1e-5
S = [1, 4, 4, 8]
rng = np.random.default_rng(42)


def w(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv(b, x, weights, bias, **kw):
    return b.op("CONV_2D", [x, b.const("k", weights), b.const("bias", bias)], S, padding="SAME",
                stride_h=1, stride_w=1, **kw)


def m_constant_folding(b, x):
    w16 = b.const("w16", w(8, 3, 3, 8).astype(np.float16))
    deq = b.op("DEQUANTIZE", [w16], [8, 3, 3, 8], dtype="float32")
    return b.op("CONV_2D", [x, deq, b.const("bias", w(8))], S, padding="SAME", stride_h=1, stride_w=1)


def m_mul_by_one(b, x):
    return b.op("TANH", [b.op("MUL", [x, b.const("one", np.ones(8, np.float32))], S)], S)


def m_div_by_one(b, x):
    return b.op("TANH", [b.op("DIV", [x, b.const("one", np.float32(1))], S)], S)


def m_add_negative_zero(b, x):
    t = b.op("ADD", [b.const("nz", np.full(8, -0.0, np.float32)), x], S)
    return b.op("TANH", [b.op("SUB", [t, b.const("z", np.float32(0))], S)], S)


def m_add_positive_zero(b, x):
    return b.op("TANH", [b.op("ADD", [x, b.const("z", np.zeros(8, np.float32))], S)], S)


def m_reorganize_chain(b, x):
    r = b.op("RESHAPE", [x, b.const("s1", np.array([16, 8], np.int32))], [16, 8], new_shape=[16, 8])
    r = b.op("RESHAPE", [r, b.const("s2", np.array([4, 32], np.int32))], [4, 32], new_shape=[4, 32])
    e = b.op("EXPAND_DIMS", [r, b.const("axis", np.array(0, np.int32))], [1, 4, 32])
    q = b.op("SQUEEZE", [e], [4, 32], squeeze_dims=[0])
    return b.op("TANH", [q], [4, 32])


def m_transpose_chain(b, x):
    t1 = b.op("TRANSPOSE", [x, b.const("p1", np.array([0, 3, 1, 2], np.int32))], [1, 8, 4, 4])
    t2 = b.op("TRANSPOSE", [t1, b.const("p2", np.array([0, 2, 3, 1], np.int32))], S)  # cancels
    t3 = b.op("TRANSPOSE", [t2, b.const("p3", np.array([0, 2, 1, 3], np.int32))], S)
    t4 = b.op("TRANSPOSE", [t3, b.const("p4", np.array([3, 1, 2, 0], np.int32))], [8, 4, 4, 1])  # composes
    return b.op("TANH", [t4], [8, 4, 4, 1])


def m_noop_cast(b, x):
    return b.op("TANH", [b.op("CAST", [x], S, in_data_type="FLOAT32", out_data_type="FLOAT32")], S)


def m_quantize_of_dequantize(b, x):
    # A float op the converter could not quantize leaves such a pair once rewriting removes it.
    from tflite_tools.model.builder import quantization

    q = b.op("QUANTIZE", [x], S, dtype="int8", quant=quantization(0.02, -3))
    deq = b.op("DEQUANTIZE", [q], S, dtype="float32")
    back = b.op("QUANTIZE", [deq], S, dtype="int8", quant=quantization(0.02, -3))
    return b.op("DEQUANTIZE", [back], S, dtype="float32")


def m_negation_into_add_sub(b, x):
    y = b.op("TANH", [x], S)
    a = b.op("ADD", [b.op("NEG", [x], S), y], S, fused_activation_function="RELU")
    return b.op("SUB", [a, b.op("NEG", [y], S)], S)


def m_double_negation(b, x):
    return b.op("TANH", [b.op("NEG", [b.op("NEG", [x], S)], S)], S)


def m_affine_into_conv(b, x):
    c = conv(b, x, w(8, 3, 3, 8), np.zeros(8, np.float32))
    m = b.op("MUL", [c, b.const("s", np.array([2, 0.5, 4, 1, 0.25, 8, 2, 1], np.float32))], S)
    d = b.op("DEPTHWISE_CONV_2D", [m, b.const("dk", w(1, 3, 3, 8)), b.const("db", np.zeros(8, np.float32))], S,
             padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1)
    return b.op("ADD", [d, b.const("shift", w(8))], S, fused_activation_function="RELU6")


def m_affine_into_conv_any(b, x):
    c = conv(b, x, w(8, 3, 3, 8), w(8))
    return b.op("ADD", [b.op("MUL", [c, b.const("s", w(8))], S), b.const("t", w(8))], S)


def m_mul_self_to_square(b, x):
    return b.op("MUL", [x, x], S)


def m_mul_minus_one_to_neg(b, x):
    return b.op("MUL", [b.const("m1", np.float32(-1)), x], S)


def m_div_by_power_of_two(b, x):
    return b.op("DIV", [x, b.const("d", np.array([2, 4, 0.5, 8, 1, 16, 2, 0.25], np.float32))], S)


def m_div_by_constant(b, x):
    return b.op("DIV", [x, b.const("d", np.array([3, 7, 0.3, 9, 1.5, 11, 2.2, 5], np.float32))], S)


def m_abs_of_product(b, x):
    y = b.op("TANH", [x], S)
    return b.op("MUL", [b.op("ABS", [x], S), b.op("ABS", [y], S)], S)


def m_reassociate_constants(b, x):
    m = b.op("MUL", [b.op("MUL", [x, b.const("c1", w(8))], S), b.const("c2", w(8))], S)
    return b.op("ADD", [b.const("a2", w(8)), b.op("ADD", [m, b.const("a1", w(8))], S)], S)


def m_factor_common_operand(b, x):
    y = b.op("TANH", [x], S)
    return b.op("ADD", [b.op("MUL", [y, b.const("c", w(8))], S), b.op("MUL", [b.const("d", w(8)), y], S)], S)


def m_add_scaled_self(b, x):
    return b.op("ADD", [x, b.op("MUL", [x, b.const("c", w(8))], S)], S)


def m_sqrt_times_sqrt(b, x):
    pos = b.op("ABS", [x], S)
    root = b.op("SQRT", [pos], S)
    simple = b.op("MUL", [root, root], S)
    a, c = b.op("TANH", [x], S), b.op("LOGISTIC", [x], S)
    root2 = b.op("SQRT", [b.op("EXP", [x], S)], S)
    general = b.op("MUL", [b.op("MUL", [a, root2], S), b.op("MUL", [root2, c], S)], S)
    return b.op("ADD", [simple, general], S)


def m_square_minus_product(b, x):
    s = b.op("TANH", [x], S)
    return b.op("SUB", [b.op("SQUARE", [s], S), b.op("MUL", [s, b.const("c", w(8))], S)], S)


def m_exp_reduce_prod(b, x):
    e = b.op("EXP", [b.op("MUL", [x, b.const("small", np.float32(0.25))], S)], S)
    return b.op("REDUCE_PROD", [e, b.const("axes", np.array([3], np.int32))], [1, 4, 4], keep_dims=False)


def m_reshape_to_inferred_dim(b, x):
    # A Keras flatten of an open batch: [batch, 4 * 4 * 8] with the batch read off SHAPE.
    shape = b.op("SHAPE", [x], [4], dtype="int32", out_type=2)  # INT32
    batch = b.op("STRIDED_SLICE", [shape, b.const("b0", np.array([0], np.int32)), b.const("b1", np.array([1], np.int32)),
                                   b.const("b2", np.array([1], np.int32))], [], dtype="int32", shrink_axis_mask=1)
    target = b.op("PACK", [batch, b.const("rest", np.int32(128))], [2], dtype="int32", values_count=2, axis=0)
    return b.op("RELU", [b.op("RESHAPE", [x, target], [1, 128])], [1, 128])



def m_row_permutation_before_product(b, x):
    # Rows split then permuted (grouped-query attention's [t, g] -> [g, t]), through a scale...
    split = b.op("RESHAPE", [b.op("BATCH_MATMUL", [x, b.const("w", w(1, 4, 8, 12))], [1, 4, 4, 12])],
                 [1, 4, 2, 2, 12], new_shape=[1, 4, 2, 2, 12])
    scaled = b.op("MUL", [split, b.const("scale", np.float32(0.125))], [1, 4, 2, 2, 12])
    a = b.op("TANH", [b.op("TRANSPOSE", [scaled, b.const("p", np.array([0, 1, 3, 2, 4], np.int32))],
                           [1, 4, 2, 2, 12])], [1, 4, 2, 2, 12])
    # ...and rows exchanged with the batch axis the right operand is broadcast along.
    spread = b.op("BATCH_MATMUL", [x, b.const("w1", w(1, 1, 8, 12))], [1, 4, 4, 12])
    moved = b.op("TRANSPOSE", [spread, b.const("q", np.array([0, 2, 1, 3], np.int32))], [1, 4, 4, 12])
    return b.op("ADD", [a, b.op("RESHAPE", [moved], [1, 4, 2, 2, 12], new_shape=[1, 4, 2, 2, 12])], [1, 4, 2, 2, 12])


def m_merged_rows_as_batch(b, x):
    merged = b.op("RESHAPE", [x], [1, 16, 8], new_shape=[1, 16, 8])
    return b.op("TANH", [b.op("BATCH_MATMUL", [merged, b.const("w", w(1, 8, 12))], [1, 16, 12])], [1, 16, 12])

CASES = {name[2:]: fn for name, fn in globals().items() if name.startswith("m_")}


def build(case):
    b = ModelBuilder()
    b.output(CASES[case](b, b.input("x", S)))
    return b.build()


def test_every_rule_has_a_case():
    assert sorted(CASES) == sorted(r.name for r in RULES)


def run_both(model_bytes, rewritten_bytes, seed=0):
    a = runtime.make_interpreter(model_bytes, resolver="reference")
    b = runtime.make_interpreter(rewritten_bytes, resolver="reference")
    inputs = runtime.random_inputs(a, seed)
    return runtime.run(a, inputs), runtime.run(b, inputs)


@pytest.mark.parametrize("rule", sorted(r.name for r in RULES))
def test_rule_preserves_results(rule):
    exact = next(r for r in RULES if r.name == rule).exact
    original = tflite_tools.serialize(build(rule))
    model = tflite_tools.parse(original)
    ops_before = [op.name for op in model.main.operators]
    log = rewrite(model, fast_math=not exact)
    assert log.counts[rule] >= 1, f"{rule} did not fire: {dict(log.counts)}"
    assert [op.name for op in model.main.operators] != ops_before
    rewritten = tflite_tools.serialize(model)
    for seed in (0, 1, 2):
        before, after = run_both(original, rewritten, seed)
        for x, y in zip(before, after):
            assert x.shape == y.shape
            if exact:
                assert x.tobytes() == y.tobytes(), f"{rule} changed bits"
            else:
                assert np.abs(x - y).max() <= FAST_MATH_TOLERANCE * np.abs(x).max(), rule


@pytest.mark.parametrize("rule", sorted(r.name for r in RULES if not r.exact))
def test_fast_math_rules_stay_off_by_default(rule):
    model = build(rule)
    log = rewrite(model, fast_math=False)
    assert all(r.name not in log.counts for r in RULES if not r.exact)


def test_exact_rules_keep_whole_models_bit_identical(model_path):
    for stem in ("transformer_encoder", "conv_fp16_weights", "mobilenet_v2_035_96"):
        original = model_path(stem).read_bytes()
        model = tflite_tools.parse(original)
        rewrite(model)
        for resolver in ("reference", "xnnpack"):
            a = runtime.make_interpreter(original, resolver=resolver)
            b = runtime.make_interpreter(tflite_tools.serialize(model), resolver=resolver)
            inputs = runtime.random_inputs(a)
            assert [o.tobytes() for o in runtime.run(a, inputs)] == [o.tobytes() for o in runtime.run(b, inputs)]


def test_fp16_weights_are_folded(model_path):
    model = tflite_tools.load(model_path("conv_fp16_weights"))
    log = rewrite(model)
    assert log.counts["constant_folding"] == 3
    assert [op.name for op in model.main.operators] == ["CONV_2D", "DEPTHWISE_CONV_2D"]
    assert all(t.type_name == "FLOAT32" for t in model.main.tensors if t.is_constant and t.data.ndim == 4)


def test_densify_of_sparse_weights_is_folded(model_path):
    original = model_path("sparse_conv_densify").read_bytes()
    model = tflite_tools.parse(original)
    assert [op.name for op in model.main.operators] == ["DENSIFY", "CONV_2D"]
    rewrite(model)
    (conv,) = model.main.operators
    assert conv.name == "CONV_2D" and conv.inputs[1].sparsity is None
    assert conv.inputs[1].data.shape == (16, 3, 3, 16) and (conv.inputs[1].data == 0).mean() > 0.7
    for resolver in ("reference", "xnnpack"):
        a = runtime.make_interpreter(original, resolver=resolver)
        b = runtime.make_interpreter(tflite_tools.serialize(model), resolver=resolver)
        inputs = runtime.random_inputs(a)
        assert runtime.run(a, inputs)[0].tobytes() == runtime.run(b, inputs)[0].tobytes()


def test_sparse_weights_are_not_fused(model_path):
    from fusion.ecg import build_ecg

    ecg = build_ecg(tflite_tools.load(model_path("sparse_fc")).main)
    assert "sparse tensor" in ecg.nodes[0].opaque_reason


def test_graph_output_identity_keeps_the_output_name():
    b = ModelBuilder()
    x = b.input("x", [4])
    t = b.op("TANH", [x], [4])
    b.output(b.op("MUL", [t, b.const("one", np.float32(1))], [4], name="result"))
    model = b.build()
    rewrite(model)
    assert [op.name for op in model.main.operators] == ["TANH"]
    assert model.main.outputs[0].name == "result"
    assert model.signatures[0].outputs["result"] is model.main.outputs[0]


def test_identity_between_input_and_output_is_kept():
    b = ModelBuilder()
    x = b.input("x", [4])
    b.output(b.op("MUL", [x, b.const("one", np.float32(1))], [4]))
    model = b.build()
    rewrite(model)
    assert [op.name for op in model.main.operators] == ["MUL"]


def test_active_rules_policy():
    exact_names = {r.name for r in active_rules("cleanup", False) + active_rules("algebraic", False)}
    assert "constant_folding" in exact_names and "factor_common_operand" not in exact_names
    assert {r.name for r in RULES} == {r.name for r in active_rules("cleanup", True) + active_rules("algebraic", True)}


def test_trace_reports_each_pass():
    lines = []
    rewrite(build("double_negation"), trace=lines.append)
    assert any(line.startswith("double_negation") for line in lines)
    assert [line.split(":")[0] for line in lines if line.startswith("after")] == [
        "after cleanup", "after algebraic", "after cleanup", "after prune"]


def test_very_sparse_fp16_weights_fold_through_densify_and_dequantize():
    # A detector's 1x1 conv weights: fp16, 95% zeros, stored sparse (DENSIFY -> DEQUANTIZE ->
    # CONV_2D). The dense result is 20x the sparse bytes; it used to exceed the fold's growth bound
    # and stay a DENSIFY nobody can fuse (the blocks around it were left to TFLite).
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 1, 1, 64)).astype(np.float16)
    w[rng.random(w.shape) < 0.95] = 0
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 64])
    dense = b.op("DENSIFY", [b.sparse_const("w_sparse", w, "float16")], w.shape, dtype="float16")
    weights = b.op("DEQUANTIZE", [dense], w.shape, dtype="float32")
    b.output(b.op("CONV_2D", [x, weights, b.const("b", np.zeros(32, np.float32))], [1, 4, 4, 32], padding="SAME",
                  stride_h=1, stride_w=1))
    original = tflite_tools.serialize(b.build())
    model = tflite_tools.parse(original)
    rewrite(model)
    (conv,) = model.main.operators
    assert conv.name == "CONV_2D" and np.array_equal(conv.inputs[1].data, w.astype(np.float32))
    a = runtime.make_interpreter(original, resolver="reference")
    inputs = runtime.random_inputs(a)
    folded = runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference")
    assert runtime.run(a, inputs)[0].tobytes() == runtime.run(folded, inputs)[0].tobytes()


@pytest.mark.parametrize("scale", [7.8e-9, 0.02, 7.3, 1e5])
@pytest.mark.parametrize("zp", [-128, 5, 127])
def test_quantize_of_dequantize_gives_back_every_int8(scale, zp):
    from tflite_tools.model.builder import quantization

    b = ModelBuilder()
    q = b.input("q", [1, 256], "int8", quant=quantization(scale, zp))
    deq = b.op("DEQUANTIZE", [q], [1, 256], dtype="float32")
    b.output(b.op("RELU", [b.op("QUANTIZE", [deq], [1, 256], dtype="int8", quant=quantization(scale, zp))], [1, 256],
                  quant=quantization(scale, zp)))
    original = tflite_tools.serialize(b.build())
    model = tflite_tools.parse(original)
    assert rewrite(model).counts["quantize_of_dequantize"] == 1
    assert [op.name for op in model.main.operators] == ["RELU"]
    every = [np.arange(-128, 128, dtype=np.int8).reshape(1, 256)]
    before = runtime.run(runtime.make_interpreter(original, resolver="reference"), every)
    after = runtime.run(runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference"), every)
    assert before[0].tobytes() == after[0].tobytes()


def _reshape_to_leading_dims(b, x):
    """x [n, h, ...] reshaped to [n, h, rest], n and h read off SHAPE (a Keras reshape of both)."""
    shape = b.op("SHAPE", [x], [4], dtype="int32", out_type=2)  # INT32

    def element(k):
        return b.op("STRIDED_SLICE", [shape, b.const(f"s{k}", np.array([k], np.int32)),
                                      b.const(f"e{k}", np.array([k + 1], np.int32)), b.const(f"t{k}", np.array([1], np.int32))],
                    [], dtype="int32", shrink_axis_mask=1)

    target = b.op("PACK", [element(0), element(1), b.const("rest", np.int32(32))], [3], dtype="int32", values_count=3,
                  axis=0)
    return b.op("RESHAPE", [x, target], [1, 4, 32])


@pytest.mark.parametrize("open_dims, fires", [([0], True), ([0, 1], False)])
def test_a_reshape_to_a_shape_read_off_an_open_batch_gets_a_constant_shape(open_dims, fires):
    # One element that varies becomes -1 (the rewritten model runs at another batch exactly as the
    # original does, and LiteRT sizes the reshape when it prepares); two cannot.
    b = ModelBuilder()
    x = b.input("x", S, shape_signature=[-1 if k in open_dims else d for k, d in enumerate(S)])
    y = _reshape_to_leading_dims(b, x)
    y.shape_signature = tuple(-1 if k in open_dims else d for k, d in enumerate((1, 4, 32)))
    b.output(y)
    original = tflite_tools.serialize(b.build())
    model = tflite_tools.parse(original)
    log = rewrite(model)
    assert (log.counts["reshape_to_inferred_dim"] == 1) == fires
    if not fires:
        return
    reshape = next(op for op in model.main.operators if op.name == "RESHAPE")
    assert reshape.inputs[1].data.tolist() == [-1, 4, 32] and "SHAPE" not in [op.name for op in model.main.operators]
    for batch in (1, 3):
        runs = []
        for data in (original, tflite_tools.serialize(model)):
            interp = runtime.make_interpreter(data, resolver="reference")
            interp.resize_tensor_input(interp.get_input_details()[0]["index"], [batch, *S[1:]])
            interp.allocate_tensors()
            runs.append(runtime.run(interp, [np.random.default_rng(batch).standard_normal([batch, *S[1:]])
                                             .astype(np.float32)])[0])
        assert runs[0].shape == (batch, 4, 32) and runs[0].tobytes() == runs[1].tobytes()
