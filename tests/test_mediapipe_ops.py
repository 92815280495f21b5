"""MediaPipe's custom CNN ops (halide_gen/lower/mediapipe.py) against LiteRT + XNNPACK, the only
LiteRT kernels that run them: per op (JIT), and a segmentation-style model through `fuse` and the
delegate, which must claim them and never make the model unrunnable."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import tflite_tools
from opcheck import compare
from tflite_tools import cli, runtime
from tflite_tools.model.builder import ModelBuilder
from tflite_tools.fuse import fuse
from tflite_tools.run import run

SAME, VALID = 1, 2


def pool_options(padding: int, k: int, activation: int = 0) -> bytes:
    """TfLitePoolParams as MediaPipe's converter writes it: padding, stride w/h, filter w/h, activation."""
    return struct.pack("<6i", padding, k, k, k, k, activation)


def transpose_conv_bias(b: ModelBuilder, x, cout: int, k: int, stride: int, padding: int, rng):
    """Convolution2DTransposeBias on `x` with its output shape as MediaPipe computes it."""
    _, h, w, cin = x.shape
    total = [max(0, k - (n - 1) % stride - 1) if padding == SAME else 0 for n in (h, w)]
    out = [1, stride * (h - 1) + k - total[0], stride * (w - 1) + k - total[1], cout]
    weights = b.const("tw", (rng.standard_normal((cout, k, k, cin)) * 0.3).astype(np.float32))
    bias = b.const("tb", rng.standard_normal(cout).astype(np.float32))
    return b.custom("Convolution2DTransposeBias", [x, weights, bias], out,
                    custom_options=struct.pack("<3i", padding, stride, stride))


def pool_argmax(b: ModelBuilder, x, k: int, padding: int):
    _, h, w, c = x.shape
    out = [1, -(-h // k), -(-w // k), c] if padding == SAME else [1, h // k, w // k, c]
    return b.custom("MaxPoolingWithArgmax2D", [x], [out, out], custom_options=pool_options(padding, k))


@pytest.mark.parametrize("hw, k, stride, padding", [((5, 7), 3, 2, SAME), ((6, 6), 3, 2, SAME), ((4, 5), 2, 2, VALID),
                                                    ((3, 3), 4, 3, SAME), ((5, 4), 1, 1, VALID), ((2, 3), 3, 1, SAME)])
def test_transpose_conv_bias(hw, k, stride, padding):
    b = ModelBuilder()
    x = b.input("x", [1, *hw, 4])
    b.output(transpose_conv_bias(b, x, 3, k, stride, padding, np.random.default_rng(k + stride)))
    compare(b.build())


@pytest.mark.parametrize("hw, k, padding", [((7, 9), 2, SAME), ((6, 6), 2, VALID), ((7, 8), 3, SAME), ((5, 5), 3, VALID)])
@pytest.mark.parametrize("ties", [False, True])
def test_max_pool_with_argmax(hw, k, padding, ties):
    # With ties (a few integer levels) the first maximum in XNNPACK's column-major order must win,
    # including the border values SAME padding repeats.
    b = ModelBuilder()
    x = b.input("x", [1, *hw, 5])
    values, indices = pool_argmax(b, x, k, padding)
    b.output(values, indices)

    def inputs(rng):
        data = rng.integers(0, 3, (1, *hw, 5)) if ties else rng.standard_normal((1, *hw, 5))
        return [data.astype(np.float32) - 1.0]

    compare(b.build(), inputs, seeds=(0, 1))


@pytest.mark.parametrize("k", [2, 3])
def test_max_unpooling(k):
    # Indices straight from the input (uint32 bits in a float32 tensor, as XNNPACK stores them);
    # out-of-window ones fail the invoke (tests/test_data_indices.py).
    b = ModelBuilder()
    values, indices = b.input("v", [1, 3, 4, 6]), b.input("i", [1, 3, 4, 6])
    b.output(b.custom("MaxUnpooling2D", [values, indices], [1, 3 * k, 4 * k, 6], custom_options=pool_options(VALID, k)))

    def inputs(rng):
        bits = rng.integers(0, k * k, (1, 3, 4, 6)).astype(np.uint32)
        return [rng.standard_normal((1, 3, 4, 6)).astype(np.float32), bits.view(np.float32)]

    compare(b.build(), inputs)


def segmenter(path):
    """A small encoder-decoder as MediaPipe's segmentation models build it: conv, argmax pooling,
    conv, unpooling at the saved indices, a transpose-conv-with-bias head, sigmoid."""
    rng = np.random.default_rng(7)
    b = ModelBuilder()

    def conv(x, cout, name):
        w = b.const(f"{name}_w", (rng.standard_normal((cout, 3, 3, x.shape[3])) * 0.3).astype(np.float32))
        return b.op("CONV_2D", [x, w, b.const(f"{name}_b", np.zeros(cout, np.float32))], [*x.shape[:3], cout],
                    padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU")

    x = b.input("image", [1, 12, 12, 3])
    e = conv(x, 8, "enc")
    pooled, where = pool_argmax(b, e, 2, SAME)
    m = conv(pooled, 8, "mid")
    up = b.custom("MaxUnpooling2D", [m, where], [1, 12, 12, 8], custom_options=pool_options(VALID, 2))
    head = transpose_conv_bias(b, conv(up, 8, "dec"), 2, 3, 2, SAME, rng)
    b.output(b.op("LOGISTIC", [head], head.shape))
    tflite_tools.save(b.build(), path)
    return path


def test_segmenter_runs_with_the_delegate_claiming_the_custom_ops(tmp_path, private_cache):
    source = segmenter(tmp_path / "segmenter.tflite")
    result = fuse(source, tmp_path / "out", cache_dir=private_cache)
    custom = [n for k in result.kernels for n, op in zip(k.nodes, k.ops) if op.startswith("CUSTOM:")]
    assert len(custom) == 3 and all(k.kernel for k in result.kernels)
    for claim in ("all", "profitable"):
        outcome = run(result.model, result.library, options={"claim": claim})
        assert outcome.ok and outcome.reference == "xnnpack", outcome.errors
        assert set(custom) <= set(outcome.claims["claimed_nodes"])


def test_custom_op_models_stay_runnable_with_claim_none(tmp_path, private_cache):
    # Nothing claimed: XNNPACK (applied after our delegate) must still get to run the custom ops.
    source = segmenter(tmp_path / "segmenter.tflite")
    result = fuse(source, tmp_path / "out", cache_dir=private_cache)
    outcome = run(result.model, result.library, options={"claim": "none"})
    assert outcome.ok and outcome.claims["claimed_nodes"] == []


def test_run_compare_names_its_reference(tmp_path, capsys):
    source = segmenter(tmp_path / "segmenter.tflite")
    assert cli.main(["run", str(source), "--compare"]) == 0
    assert "reference: LiteRT + XNNPACK" in capsys.readouterr().out
    assert cli.main(["run", str(source), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reference"] == "xnnpack"


@pytest.mark.parametrize("options, reason", [((SAME, 2, 2, 3, 3, 0), "filter 3x3 with stride 2x2"),
                                             ((SAME, 2, 2, 2, 2, 1), "fused activation 1")])
def test_pooling_xnnpack_refuses_is_left_to_tflite(tmp_path, options, reason, private_cache):
    # The lowering refuses what XNNPACK refuses, so the block is reported without a kernel
    # instead of claimed with guessed semantics.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 2])
    v, i = b.custom("MaxPoolingWithArgmax2D", [x], [[1, 3, 3, 2]] * 2, custom_options=struct.pack("<6i", *options))
    b.output(v, i)
    tflite_tools.save(b.build(), tmp_path / "m.tflite")
    result = fuse(tmp_path / "m.tflite", tmp_path / "out", cache_dir=private_cache)
    (record,) = result.kernels
    assert record.kernel is None and reason in record.skipped


def test_argmax_pooling_and_its_unpooling_are_claimed_together(tmp_path, private_cache):
    # Their index encoding is their kernels' own: claiming the pooling's block without the
    # unpooling's would hand our indices to another runtime's kernel. Asked for one alone, the
    # delegate declines it, names the other, and the model still matches.
    source = segmenter(tmp_path / "segmenter.tflite")
    result = fuse(source, tmp_path / "out", cache_dir=private_cache)
    pool = next(k for k in result.kernels if "CUSTOM:MaxPoolingWithArgmax2D" in k.ops)
    unpool = next(k for k in result.kernels if "CUSTOM:MaxUnpooling2D" in k.ops)
    assert pool.block != unpool.block
    outcome = run(result.model, result.library, options={"claim": "all", "blocks": pool.block})
    assert outcome.ok and outcome.claims["claimed_blocks"] == []
    (declined,) = outcome.claims["declined"]
    assert declined["block"] == pool.block and f"argmax indices with {unpool.block}" in declined["reason"]
    both = run(result.model, result.library, options={"claim": "all", "blocks": f"{pool.block},{unpool.block}"})
    assert both.ok and both.claims["claimed_blocks"] == [pool.block, unpool.block]


def test_resizing_a_custom_op_model_fails_with_the_reason(tmp_path, private_cache):
    # Models with custom ops keep the graph mutable (see the delegate's flags), so a resize reaches
    # the claimed kernels, whose shapes are fixed. A partition holding MediaPipe's ops cannot run
    # TFLite's kernels in their place (TFLite has none; only XNNPACK runs them): Prepare refuses
    # with the reason, nothing crashes.
    source = segmenter(tmp_path / "segmenter.tflite")
    result = fuse(source, tmp_path / "out", cache_dir=private_cache)
    d = runtime.load_delegate(str(result.library), options={"claim": "all"})
    interp = runtime.make_interpreter(result.model, delegates=[d])
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [1, 16, 16, 3])
    with pytest.raises(RuntimeError, match="compiled for static shapes and the partition holds custom op"):
        interp.allocate_tensors()
