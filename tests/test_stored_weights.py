"""Weights keep their stored form in the fused model: fp16 and sparse constants stay fp16 and
sparse, with the DEQUANTIZE / DENSIFY nodes that decode them (fusion.rewrite.fold.restore_decoded),
while the kernels are compiled from the decoded values and take them from TFLite at the first
Invoke (delegate/src/partition.cc); the decoders of claimed blocks' weights run in the delegate,
once, with TFLite's kernels (delegate/src/claim.h)."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.pipeline import plan_model
from fusion.rewrite.fold import restore_decoded
from tflite_tools import serialize
from tflite_tools.fuse import fuse
from tflite_tools.model.builder import ModelBuilder
from tflite_tools.model.reader import load
from tflite_tools.run import run


def fp16_conv(w: np.ndarray, sparse: bool = True) -> bytes:
    """x -> CONV_2D(x, DEQUANTIZE(DENSIFY(w stored sparse in fp16))) + RELU; without `sparse`,
    w is stored dense and only DEQUANTIZE decodes it."""
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 8])
    if sparse:
        dense16 = b.op("DENSIFY", [b.sparse_const("w_sparse16", w, "float16")], w.shape, "float16")
    else:
        dense16 = b.const("w16", w, "float16")
    w32 = b.op("DEQUANTIZE", [dense16], w.shape, "float32")
    b.output(b.op("CONV_2D", [x, w32, b.const("bias", np.linspace(-1, 1, w.shape[0]))], [1, 6, 6, w.shape[0]],
                  padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU"))
    return serialize(b.build())


def stored_bytes(path) -> int:
    """The bytes of a model's constants as stored (sparse, fp16, int8)."""
    return sum(t.data.nbytes for t in load(path).main.tensors if t.data is not None)


def weights(seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((16, 3, 3, 8)).astype(np.float16)
    w[:, :, :, ::3] = 0  # a third of the input channels pruned
    return w


def test_restore_decoded_puts_the_decoder_back_in_front(tmp_path):
    (tmp_path / "m.tflite").write_bytes(fp16_conv(weights()))
    model = load(tmp_path / "m.tflite")
    plan_model(model)
    sg = model.main
    (conv,) = sg.operators  # both decoders folded: the compiler sees float32 weights
    w = conv.inputs[1]
    assert w.is_constant and w.type_name == "FLOAT32" and w.decoded_from.name == "DEQUANTIZE"
    assert restore_decoded(sg) == 2
    assert [op.name for op in sg.operators] == ["DENSIFY", "DEQUANTIZE", "CONV_2D"]
    assert sg.operators[1].outputs == [w] and not w.is_constant
    # The whole chain comes back: the weights stay sparse and fp16.
    (dense16,) = sg.operators[1].inputs
    assert sg.operators[0].outputs == [dense16] and not dense16.is_constant
    (stored,) = sg.operators[0].inputs
    assert stored.is_constant and stored.type_name == "FLOAT16" and stored.sparsity is not None
    assert stored in sg.tensors and dense16 in sg.tensors
    assert restore_decoded(sg) == 0  # nothing left to restore


@pytest.mark.parametrize("claim", ["all", "none"])
def test_a_conv_on_sparse_fp16_weights_keeps_them_sparse_and_runs_their_decoders_itself(tmp_path, monkeypatch, claim,
                                                                                        private_cache):
    # XNNPACK takes a DENSIFY whose DEQUANTIZE feeds a node of ours and never writes its output:
    # the delegate claims the decoders with the conv and runs TFLite's kernels for them.
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(private_cache.parent))
    w = weights()
    (tmp_path / "m.tflite").write_bytes(fp16_conv(w))
    result = fuse(tmp_path / "m.tflite", tmp_path / "out")
    assert result.decoders == 2
    fused = load(result.model)
    assert [op.name for op in fused.main.operators] == ["DENSIFY", "DEQUANTIZE", "CONV_2D"]
    assert stored_bytes(result.model) == stored_bytes(tmp_path / "m.tflite")
    (record,) = [k for k in result.kernels if k.kernel]
    assert record.nodes == [2]  # the conv's index in the file, behind its decoders
    outcome = run(result.model, delegate=result.library, options={"claim": claim}, seed=3)
    assert outcome.ok, outcome.errors
    assert outcome.claims["claimed_nodes"] == ([0, 1, 2] if claim == "all" else [])
    assert outcome.claims["declined"] == []


def test_infinity_in_stored_fp16_weights_leaves_the_block_to_tflite(tmp_path, monkeypatch, private_cache):
    # The claim-time check of weights (test_special_values) reads the stored fp16 values: the
    # decoded ones do not exist until TFLite runs its DEQUANTIZE.
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(private_cache.parent))
    w = weights()
    w[3, 0, 0, 1] = np.inf
    (tmp_path / "m.tflite").write_bytes(fp16_conv(w, sparse=False))
    result = fuse(tmp_path / "m.tflite", tmp_path / "out")
    outcome = run(result.model, delegate=result.library, options={"claim": "all"}, seed=3)
    assert outcome.ok, outcome.errors
    assert outcome.claims["claimed_nodes"] == []
    (declined,) = outcome.claims["declined"]
    assert "stored weight 'w16' holds NaN or infinity" in declined["reason"]


@pytest.mark.parametrize("stem, decoders", [("conv_fp16_weights", {"DEQUANTIZE": 3}),
                                            ("sparse_conv_densify", {"DENSIFY": 1}),
                                            ("sparse_fp16_conv", {"DENSIFY": 2, "DEQUANTIZE": 4}),
                                            ("transformer_encoder_fp16", {"DEQUANTIZE": 11})])
def test_converter_models_keep_their_stored_weights(stem, decoders, model_path, tmp_path, monkeypatch, private_cache):
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(private_cache.parent))
    result = fuse(model_path(stem), tmp_path / "out")
    assert stored_bytes(result.model) == stored_bytes(model_path(stem))
    ops = [op.name for op in load(result.model).main.operators]
    counted = {name: ops.count(name) for name in decoders}
    assert counted == decoders and ops[:result.decoders] == [n for n in ops if n in decoders]
    outcome = run(result.model, delegate=result.library, options={"claim": "all"}, seed=4)
    assert outcome.ok, outcome.errors
    assert outcome.claims["declined"] == []
