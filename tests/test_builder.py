"""The builder writes models LiteRT runs with the semantics asked for, and rejects bad requests."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tflite_tools
from tflite_tools import runtime
from tflite_tools.model.builder import ModelBuilder, make_options, quantization, tensor_type
from conftest import MODELS, REPO


def run_reference(model, *inputs):
    interp = runtime.make_interpreter(tflite_tools.serialize(model), resolver="reference")
    return runtime.run(interp, list(inputs))


def test_add_with_fused_relu_matches_numpy():
    b = ModelBuilder()
    x, y = b.input("x", [1, 3, 5]), b.input("y", [1, 3, 5])
    b.output(b.op("ADD", [x, y], [1, 3, 5], fused_activation_function="RELU"))
    rng = np.random.default_rng(0)
    a, c = rng.standard_normal((2, 1, 3, 5), dtype=np.float32)
    (out,) = run_reference(b.build(), a, c)
    np.testing.assert_array_equal(out, np.maximum(a + c, 0))


def test_conv_options_reach_the_runtime():
    b = ModelBuilder()
    x = b.input("x", [1, 5, 5, 1])
    w = b.const("w", np.ones([1, 3, 3, 1], np.float32))
    bias = b.const("b", np.zeros([1], np.float32))
    b.output(b.op("CONV_2D", [x, w, bias], [1, 3, 3, 1], padding="VALID", stride_h=1, stride_w=1))
    image = np.arange(25, dtype=np.float32).reshape(1, 5, 5, 1)
    (out,) = run_reference(b.build(), image)
    expected = np.array([[image[0, i : i + 3, j : j + 3, 0].sum() for j in range(3)] for i in range(3)])
    np.testing.assert_array_equal(out[0, :, :, 0], expected)


def test_fully_connected_softmax_matches_numpy(model_path):
    model = tflite_tools.load(model_path("fc_softmax"))
    fc = model.main.operators[0]
    w, bias = fc.inputs[1].data, fc.inputs[2].data
    x = np.random.default_rng(1).standard_normal((2, 17)).astype(np.float32)
    (out,) = run_reference(model, x)
    logits = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)


def test_split_gives_two_outputs(model_path):
    model = tflite_tools.load(model_path("split_outputs"))
    x = np.random.default_rng(2).standard_normal((1, 4, 6)).astype(np.float32)
    lo, hi = run_reference(model, x)
    np.testing.assert_allclose(lo, np.tanh(x[..., :3]), rtol=1e-6)
    np.testing.assert_array_equal(hi, x[..., 3:])


def test_reshape_transpose_moves_data(model_path):
    model = tflite_tools.load(model_path("reshape_transpose"))
    x = np.arange(48, dtype=np.float32).reshape(1, 6, 8)
    (out,) = run_reference(model, x)
    np.testing.assert_array_equal(out, x.reshape(1, 6, 2, 4).transpose(0, 2, 1, 3))


def test_int8_add_within_one_lsb(model_path):
    model = tflite_tools.load(model_path("int8_add"))
    x_t, y_t = model.main.inputs
    (o_t,) = model.main.outputs
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 8, 3), dtype=np.int8)
    y = rng.integers(-128, 128, (1, 8, 3), dtype=np.int8)
    (out,) = run_reference(model, x, y)

    def real(q, t):
        return (q.astype(np.float64) - t.quantization.zero_point[0]) * t.quantization.scale[0]

    so, zo = o_t.quantization.scale[0], o_t.quantization.zero_point[0]
    expected = np.clip(np.round((real(x, x_t) + real(y, y_t)) / so) + zo, -128, 127)
    assert np.abs(out.astype(np.int32) - expected).max() <= 1


def test_per_channel_quantization_helper():
    q = quantization([0.1, 0.2, 0.3], 0, axis=3)
    assert q.per_channel and q.quantized_dimension == 3
    assert q.zero_point.tolist() == [0, 0, 0]


def test_dtype_spellings():
    assert tensor_type("int8") == tensor_type(np.int8) == tensor_type("INT8") == 9
    with pytest.raises(ValueError, match="no TFLite tensor type"):
        tensor_type("complex256")


def test_unknown_option_names_what_is_allowed():
    with pytest.raises(TypeError, match="has no option 'strides'.*stride_w"):
        make_options("CONV_2D", {"strides": 2})


def test_bad_enum_value():
    with pytest.raises(ValueError, match="'SOMETIMES' is not a valid padding"):
        make_options("CONV_2D", {"padding": "SOMETIMES"})


def test_op_without_options_rejects_them():
    with pytest.raises(TypeError, match="RELU takes no options"):
        make_options("RELU", {"alpha": 1})


def test_unknown_op():
    with pytest.raises(KeyError, match="unknown TFLite builtin operator 'CONV_9D'"):
        ModelBuilder().op("CONV_9D", [], [1])


def test_builder_models_are_deterministic_and_committed():
    # The script's builder part reproduces the committed bytes exactly.
    sys.path.insert(0, str(MODELS))
    try:
        import make_models
    finally:
        sys.path.remove(str(MODELS))
    for name, data in make_models.builder_model_bytes().items():
        assert (MODELS / f"{name}.tflite").read_bytes() == data, f"{name}: rerun tests/models/make_models.py"
    assert REPO.joinpath("tests", "models", "make_models.py").exists()


def test_the_model_layer_imports_no_stage_above_it():
    # Data flows one way: model -> graph IR -> rewrite -> ... -> package. tflite_tools.model is the
    # bottom layer: it imports nothing of the project's outside itself (not the commands beside it in
    # tflite_tools, not fusion or halide_gen) and of LiteRT only the flatbuffer schema, never its
    # interpreter. The commands' helpers that read no stage above are checked the same way.
    import pkgutil
    import subprocess
    import sys

    import tflite_tools.model

    modules = [f"tflite_tools.model.{m.name}" for m in pkgutil.iter_modules(tflite_tools.model.__path__)]
    assert {"tflite_tools.model.ir", "tflite_tools.model.reader", "tflite_tools.model.writer"} <= set(modules)
    script = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
              + "ours = {n for n in sys.modules if n.split('.')[0] in ('tflite_tools', 'fusion', 'halide_gen', 'halide')}\n"
                "print(sorted(n for n in ours if n != 'tflite_tools' and not n.startswith('tflite_tools.model'))"
                " + sorted(n for n in sys.modules if n.endswith('.interpreter')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

    helpers = ["tflite_tools.info", "tflite_tools.outdir", "tflite_tools.sharedlib", "tflite_tools.runtime"]
    script = ("import sys\n" + "".join(f"import {m}\n" for m in helpers)
              + "print(sorted({n.split('.')[0] for n in sys.modules} & {'fusion', 'halide_gen', 'halide'}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_fusion_stage_imports_only_the_model_layer_below_it():
    # fusion (rewrite, classify, plan, report) reads the graph IR, and runs LiteRT through
    # tflite_tools.runtime (folding, sizing as LiteRT does), and nothing above: not the commands in
    # tflite_tools, not halide_gen. (tflite_tools.interrupts is the runtime's: a leaf of its own.)
    import pkgutil
    import subprocess
    import sys

    import fusion

    modules = [f"fusion.{m.name}" for m in pkgutil.walk_packages(fusion.__path__, prefix="")]
    script = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
              + "print(sorted(n for n in sys.modules if n.split('.')[0] == 'halide_gen' or (n.startswith('tflite_tools.')"
                " and not n.startswith(('tflite_tools.model', 'tflite_tools.runtime', 'tflite_tools.interrupts')))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
