"""NaN, +-inf and values near the float limits, per op, against LiteRT's reference kernels: a NaN
where the reference has one, the same infinities, and the finite values within the usual tolerance
(halide_gen.lower.ieee says which C++ expression each construct mirrors)."""

from __future__ import annotations

import numpy as np
import pytest

import opcheck
from tflite_tools.model.builder import ModelBuilder

SPECIAL = np.array([np.nan, np.inf, -np.inf, 3.0e38, -3.0e38, 1e-40, 0.0, -0.0, 88.8, -104.0, 20.0, -10.0,
                    1.5, -2.5, 0.25, 7.0], np.float32)


def special(shape, rng, fraction=0.3):
    """Ordinary values with about `fraction` of them replaced by special ones, and at least one
    NaN, +inf and -inf each."""
    values = rng.standard_normal(shape).astype(np.float32) * 3
    mask = rng.random(shape) < fraction
    values[mask] = rng.choice(SPECIAL, size=int(mask.sum()))
    flat = values.reshape(-1)
    flat[rng.choice(flat.size, size=min(3, flat.size), replace=False)] = [np.nan, np.inf, -np.inf][:min(3, flat.size)]
    return values


def assert_same_specials(ref: np.ndarray, got: np.ndarray) -> None:
    """NaN in the same places, the same infinities, finite values within FLOAT_RTOL of the range."""
    assert ref.shape == got.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg="NaN in different places")
    finite_ref = np.isfinite(ref)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref), err_msg="inf in different places")
    infinite = np.isinf(ref)
    np.testing.assert_array_equal(got[infinite], ref[infinite])
    if finite_ref.any():
        scale = max(float(np.abs(ref[finite_ref]).max()), 1e-30)
        err = float(np.abs(ref[finite_ref].astype(np.float64) - got[finite_ref]).max()) / scale
        assert err <= opcheck.FLOAT_RTOL, f"relative error {err:.3g}"


def unary(op, shape=(1, 4, 5, 6), **opts):
    return opcheck.unary_model(op, shape, **opts)


def binary(op, act=None, shape=(1, 4, 5, 6)):
    return opcheck.binary_model(op, shape, shape, fused_activation_function=act)


def conv(op, act, rng):
    b = ModelBuilder()
    x = b.input("x", [1, 5, 5, 4])
    if op == "CONV_2D":
        w, out = rng.standard_normal((3, 3, 3, 4)), [1, 5, 5, 3]
        opts = dict(padding="SAME", stride_h=1, stride_w=1)
    elif op == "DEPTHWISE_CONV_2D":
        w, out = rng.standard_normal((1, 3, 3, 4)), [1, 5, 5, 4]
        opts = dict(padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1)
    else:
        b = ModelBuilder()
        x = b.input("x", [2, 12])
        w, out, opts = rng.standard_normal((5, 12)), [2, 5], {}
    bias = b.const("b", rng.standard_normal(out[-1]).astype(np.float32))
    b.output(b.op(op, [x, b.const("w", w.astype(np.float32)), bias], out, fused_activation_function=act, **opts))
    return b.build()


def pool(op, act, padding="SAME", size=3):
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 3])
    b.output(b.op(op, [x], [1, 3, 3, 3], padding=padding, stride_h=2, stride_w=2, filter_height=size,
                  filter_width=size, fused_activation_function=act))
    return b.build()


def reduce(op, axis):
    b = ModelBuilder()
    x = b.input("x", [2, 5, 33])
    out = [2, 5] if axis == 2 else [2, 33]
    b.output(b.op(op, [x, b.const("axis", np.array([axis], np.int32))], out, keep_dims=False))
    return b.build()


def concat(act):
    b = ModelBuilder()
    x, y = b.input("x", [1, 3, 4, 2]), b.input("y", [1, 3, 4, 3])
    b.output(b.op("CONCATENATION", [x, y], [1, 3, 4, 5], axis=3, fused_activation_function=act))
    return b.build()


def resize():
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 3])
    b.output(b.op("RESIZE_BILINEAR", [x, b.const("size", np.array([7, 9], np.int32))], [1, 7, 9, 3]))
    return b.build()


def transpose_conv(rng):
    b = ModelBuilder()
    x = b.input("x", [1, 3, 3, 4])
    w = b.const("w", rng.standard_normal((2, 3, 3, 4)).astype(np.float32))
    b.output(b.op("TRANSPOSE_CONV", [b.const("shape", np.array([1, 6, 6, 2], np.int32)), w, x], [1, 6, 6, 2],
                  padding="SAME", stride_h=2, stride_w=2))
    return b.build()


def batch_matmul():
    b = ModelBuilder()
    x, y = b.input("x", [2, 3, 5]), b.input("y", [2, 5, 4])
    b.output(b.op("BATCH_MATMUL", [x, y], [2, 3, 4]))
    return b.build()


def prelu():
    b = ModelBuilder()
    x = b.input("x", [1, 4, 5, 6])
    alpha = np.array([0.0, 0.25, -1.0, 2.0, 0.5, 0.0], np.float32).reshape(1, 1, 6)
    b.output(b.op("PRELU", [x, b.const("alpha", alpha)], [1, 4, 5, 6]))
    return b.build()


def rows(op, depth, **opts):
    return unary(op, (3, depth), **opts)


CASES = {
    **{op: (lambda op=op: unary(op)) for op in [
        "ABS", "NEG", "SIN", "COS", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "FLOOR", "CEIL", "ROUND", "LOGISTIC", "TANH",
        "RELU", "RELU6", "RELU_N1_TO_1", "HARD_SWISH", "LEAKY_RELU", "ELU"]},
    "LEAKY_RELU alpha 0.3": lambda: unary("LEAKY_RELU", alpha=0.3),
    "PRELU": lambda: prelu(),
    "GELU": lambda: unary("GELU", approximate=False),
    "GELU approximate": lambda: unary("GELU", approximate=True),
    **{f"{op} {act}": (lambda op=op, act=act: binary(op, act))
       for op in ("ADD", "SUB", "MUL", "DIV") for act in ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")},
    **{op: (lambda op=op: binary(op)) for op in ("MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "POW")},
    "CONCATENATION NONE": lambda: concat("NONE"),
    "RESIZE_BILINEAR": lambda: resize(),
    "TRANSPOSE_CONV": lambda: transpose_conv(np.random.default_rng(3)),
    "BATCH_MATMUL": lambda: batch_matmul(),
    **{f"{op} {act}": (lambda op=op, act=act: conv(op, act, np.random.default_rng(3)))
       for op in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED") for act in ("NONE", "RELU", "RELU6")},
    **{f"{op} {act}": (lambda op=op, act=act: pool(op, act))
       for op in ("MAX_POOL_2D", "AVERAGE_POOL_2D") for act in ("NONE", "RELU6")},
    "MAX_POOL_2D VALID 2x2": lambda: pool("MAX_POOL_2D", "NONE", "VALID", 2),  # no tap outside: no bounds test
    **{f"{op} axis {axis}": (lambda op=op, axis=axis: reduce(op, axis))
       for op in ("SUM", "MEAN", "REDUCE_MAX", "REDUCE_MIN") for axis in (1, 2)},
    "SOFTMAX": lambda: rows("SOFTMAX", 40, beta=1.0),
    "SOFTMAX short rows": lambda: rows("SOFTMAX", 7, beta=0.5),
    "LOG_SOFTMAX": lambda: rows("LOG_SOFTMAX", 40),
    "L2_NORMALIZATION": lambda: rows("L2_NORMALIZATION", 9),
}


def check_specials(case: str, run) -> None:
    """The case's model on special inputs (two seeds): `run(model, inputs)` against LiteRT's reference."""
    model = CASES[case]()
    for seed in (0, 1):
        r = np.random.default_rng(seed)
        # Sparse specials for ops that mix a whole row or window, so that some outputs stay finite.
        fraction = 0.03 if any(k in case for k in ("SOFTMAX", "L2", "SUM", "MEAN", "REDUCE", "CONV", "FULLY", "MATMUL", "RESIZE")) else 0.3
        inputs = [special(tuple(t.shape), r, fraction) for t in model.main.inputs]
        for ref, got in zip(opcheck.reference(model, inputs), run(model, inputs)):
            assert_same_specials(ref, got)


@pytest.mark.parametrize("case", sorted(CASES))
def test_nan_and_inf_as_litert(case):
    check_specials(case, opcheck.halide)


@pytest.mark.cross
@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_nan_and_inf_as_litert_on_arm64(case, tmp_path, cross_tools):
    # ARM kernels leave NaN and inf to NEON's fmax / fmin instead of testing for them
    # (LoweringOptions.native_minmax): the same cases, compiled for arm64-linux, under qemu.
    check_specials(case, lambda model, inputs: opcheck.aot(model, inputs, "arm64-linux", tmp_path))


# -- run --compare: a NaN where the reference has one is a match ----------------------------------


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("out, ref, ok", [
    ([NAN, NAN], [NAN, NAN], True),  # all NaN on both sides: the same answer
    ([NAN, 1.0], [NAN, 1.0], True),
    ([NAN, 1.0], [2.0, 1.0], False),
    ([2.0, 1.0], [NAN, 1.0], False),
    ([INF, 1.0], [INF, 1.0], True),
    ([3.4028235e38, 1.0], [INF, 1.0], False),
    ([-INF, 1.0], [INF, 1.0], False),
    ([INF, 1.00001], [INF, 1.0], True),  # the finite rest within tolerance of its own range
    ([INF, 1.1], [INF, 1.0], False),
])
def test_compare_treats_specials_in_the_same_place_as_equal(out, ref, ok):
    from tflite_tools.run import compare

    (error,) = compare([np.array(out, np.float32)], [np.array(ref, np.float32)], ["y"])
    assert error.ok is ok


def test_nan_weights_leave_the_block_to_tflite(tmp_path, monkeypatch, private_cache):
    # TFLite's depthwise kernel skips the taps that fall on padding; our kernels multiply a
    # zero-padded input, and 0 * NaN is NaN. Found by the mutation fuzzer (garbage in a fused
    # model's weights); weights are read at run time, so the delegate checks them when it claims.
    from tflite_tools import serialize
    from tflite_tools.fuse import fuse
    from tflite_tools.run import run

    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(private_cache.parent))
    w = np.ones((1, 3, 3, 4), np.float32)
    w[0, 0, 0, 2] = np.nan
    b = ModelBuilder()
    x = b.input("x", [1, 5, 5, 4])
    b.output(b.op("DEPTHWISE_CONV_2D", [x, b.const("w", w), b.const("b", np.zeros(4, np.float32))], [1, 5, 5, 4],
                  padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1))
    (tmp_path / "nan_weights.tflite").write_bytes(serialize(b.build()))
    result = fuse(tmp_path / "nan_weights.tflite", tmp_path / "out")
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.ok, outcome.errors
    assert outcome.claims["claimed_nodes"] == []
    assert "holds NaN or infinity" in outcome.claims["declined"][0]["reason"]


@pytest.mark.parametrize("native_minmax", [False, True])
def test_exp_of_nonpositive_values_is_accurate_and_underflows_to_zero(native_minmax):
    """halide_gen.lower.ieee.exp_nonpositive: within 4e-7 of e^x while e^x is a normal float, and
    exactly 0 well below it (a masked attention score), never a tiny normal that turns the products
    it enters subnormal; in both clamp forms (x86's and ARM's)."""
    import halide as hl

    from halide_gen.lower.ieee import exp_nonpositive

    x = np.concatenate([np.linspace(-87.3, 0, 20001), [-87.7, -88.0, -88.5, -100.0, -1e9, -np.inf]]).astype(np.float32)
    values = hl.Buffer(x)
    i = hl.Var("i")
    f = hl.Func("exp_nonpositive")
    f[i] = exp_nonpositive(values[i], native_minmax=native_minmax)
    got = np.asarray(f.realize([x.size]))
    normal = x >= -87.3
    want = np.exp(x[normal].astype(np.float64))
    assert float(np.abs(got[normal] / want - 1).max()) <= 4e-7
    np.testing.assert_array_equal(got[~normal], 0.0)



@pytest.mark.parametrize("native_minmax", [False, True])
def test_expm1_and_tanh_keep_their_digits_near_zero_and_their_limits(native_minmax):
    """halide_gen.lower.ieee.expm1_nonpositive (ELU) and tanh: relative accuracy holds down to tiny
    arguments (where e^x - 1 would cancel to 0), -inf gives -1, +-inf give +-1 and +-0 keep their
    sign; in both clamp forms."""
    import halide as hl

    from halide_gen.lower.ieee import expm1_nonpositive, tanh

    tiny = np.geomspace(1e-37, 1, 4001)
    x = np.concatenate([-tiny, np.linspace(-87, 0, 20001)]).astype(np.float32)
    y = np.concatenate([tiny, -tiny, np.linspace(-20, 20, 20001)]).astype(np.float32)
    ends = np.array([-np.inf, np.inf, 0.0, -0.0], np.float32)
    i = hl.Var("i")

    def realize(fn, values):
        buf = hl.Buffer(values)
        f = hl.Func("f")
        f[i] = fn(buf[i])
        f.vectorize(i, 8, hl.TailStrategy.GuardWithIf)
        return np.asarray(f.realize([values.size]))

    got = realize(lambda v: expm1_nonpositive(v, native_minmax=native_minmax), x)
    want = np.expm1(x.astype(np.float64))
    assert float(np.abs(got[want != 0] / want[want != 0] - 1).max()) <= 2e-7
    assert realize(lambda v: expm1_nonpositive(v, native_minmax=native_minmax), ends[:1])[0] == -1
    got = realize(lambda v: tanh(v, native_minmax=native_minmax), y)
    want = np.tanh(y.astype(np.float64))
    assert float(np.abs(got[want != 0] / want[want != 0] - 1).max()) <= 2.5e-7
    got = realize(lambda v: tanh(v, native_minmax=native_minmax), ends)
    np.testing.assert_array_equal(got, [-1, 1, 0, 0])
    assert list(np.signbit(got[2:])) == [False, True]


def test_tanh_gelu_matches_its_definition_and_the_reference_at_the_limits():
    """The tanh-form GELU (halide_gen.lower.elementwise._gelu_tanh: x / (1 + (e^-u)^2)): within 2e-6
    relative of 0.5 x (1 + tanh u) in float64 where that is a normal float not rounded from a tail
    (x > -4; below, e^-2u's argument carries x's rounding, 2u eps), and around the point where
    e^-2u overflows, as the reference in float: -0 below, NaN at -inf, +inf at +inf."""
    import halide as hl

    from halide_gen.lower.elementwise import gelu

    x = np.concatenate([np.linspace(-4, 12, 40001), np.linspace(-10.5, -9.5, 1001),
                        [-np.inf, np.inf, -3e38, 3e38, -104.0, 0.0, -0.0]]).astype(np.float32)
    i = hl.Var("i")
    for native_minmax in (False, True):
        buf = hl.Buffer(x)
        f = hl.Func("gelu")
        f[i] = gelu(buf[i], True, native_minmax)
        f.vectorize(i, 8, hl.TailStrategy.GuardWithIf)
        got = np.asarray(f.realize([x.size]))
        xd = x.astype(np.float64)
        with np.errstate(all="ignore"):
            want = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
        body = np.arange(x.size) < 40001
        body &= want != 0
        assert float(np.abs(got[body] / want[body] - 1).max()) <= 2e-6
        tail = slice(40001, 41002)  # e^-2u near float's overflow: the results are -0 or tinier than 1e-30
        assert float(np.abs(got[tail]).max()) < 1e-30 and np.signbit(got[tail]).all()
        np.testing.assert_array_equal(got[-7:], np.array([np.nan, np.inf, -0.0, 3e38, -0.0, 0.0, -0.0], np.float32))
        assert list(np.signbit(got[-6:])) == [False, True, False, True, False, True]
