"""`tflite_tools info`: figures checked by hand on small models, and it runs on every model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tflite_tools
from tflite_tools import cli
from tflite_tools.model import stats
from tflite_tools.model.builder import ModelBuilder
from tflite_tools.info import model_info
from conftest import model_id, project_model_paths, shared_model_paths


def info_of(path: Path) -> dict:
    return model_info(tflite_tools.load(path))


def test_conv_flops_and_histogram(model_path):
    info = info_of(model_path("conv_relu6"))
    # output 1x5x4x5 = 100 elements, each 3x3x3 = 27 MACs
    assert info["flops"] == 2 * 100 * 27
    assert info["op_histogram"] == {"CONV_2D+RELU6": 1}
    assert info["weight_bytes"] == (5 * 3 * 3 * 3 + 5) * 4


def test_depthwise_and_fc_flops(model_path):
    assert info_of(model_path("depthwise_residual"))["flops"] == 2 * (6 * 6 * 7) * 9
    assert info_of(model_path("fc_softmax"))["flops"] == 2 * (2 * 10) * 17


def test_batch_matmul_and_transpose_conv_flops():
    b = ModelBuilder()
    x = b.input("x", [2, 3, 5])
    y = b.input("y", [2, 5, 4])
    mm = b.op("BATCH_MATMUL", [x, y], [2, 3, 4])
    img = b.input("img", [1, 4, 4, 6])
    shape = b.const("oshape", np.array([1, 8, 8, 3], np.int32))
    w = b.const("w", np.zeros([3, 2, 2, 6], np.float32))
    up = b.op("TRANSPOSE_CONV", [shape, w, img], [1, 8, 8, 3], padding="SAME", stride_h=2, stride_w=2)
    b.output(mm, up)
    model = b.build()
    mm_op, up_op = model.main.operators
    assert stats.flops(mm_op) == 2 * (2 * 3 * 4) * 5
    assert stats.flops(up_op) == 2 * (4 * 4 * 6) * (3 * 2 * 2)


def test_peak_live_set_by_hand(model_path):
    # x -> MUL -> s -> ADD -> t -> LOGISTIC -> g; MUL(t, g) -> out; each tensor 1x5x5x8 floats.
    one = 5 * 5 * 8 * 4
    info = info_of(model_path("swish_chain"))
    assert info["activation_bytes"] == 5 * one
    assert info["peak_activation_bytes"] == 3 * one  # t, g and out during the last MUL


def test_graph_outputs_live_to_the_end():
    b = ModelBuilder()
    x = b.input("x", [100])
    early = b.op("RELU", [x], [100])
    late = b.op("TANH", [b.op("EXP", [x], [100])], [100])
    b.output(early, late)
    sg = b.build().main
    # During EXP: x, early (a graph output) and exp's result; during TANH: early, exp, late.
    assert stats.peak_live_bytes(sg) == 3 * 400
    spans = {lt.tensor.name: (lt.first, lt.last) for lt in stats.lifetimes(sg)}
    assert spans["x"] == (-1, 1)
    assert spans["relu"] == (0, 3)


def test_quantized_io_and_json_shape(model_path, capsys):
    assert cli.main(["info", "--json", str(model_path("mobilenet_v2_035_96_int8"))]) == 0
    info = json.loads(capsys.readouterr().out)
    for key in ("inputs", "outputs", "op_histogram", "tensors", "weight_bytes", "activation_bytes",
                "peak_activation_bytes", "flops", "custom_ops", "dynamic_tensors", "subgraphs"):
        assert key in info
    (inp,) = info["inputs"]
    assert inp["dtype"] == "INT8" and inp["shape"] == [1, 96, 96, 3]
    assert inp["quantization"]["per_channel"] is False
    assert info["flops"] == info_of(model_path("mobilenet_v2_035_96"))["flops"]


def test_text_report_shows_fused_activations(model_path, capsys):
    assert cli.main(["info", str(model_path("mobilenet_v2_035_96"))]) == 0
    out = capsys.readouterr().out
    assert "CONV_2D+RELU6" in out and "DEPTHWISE_CONV_2D+RELU6" in out
    assert "peak live" in out and "FLOPs:" in out and "flags: none" in out


def test_dynamic_dimensions_are_listed(model_path):
    info = info_of(model_path("dynamic_batch"))
    assert info["inputs"][0]["dynamic"] is True
    assert info["inputs"][0]["shape_signature"] == [-1, 4]
    assert "x" in info["dynamic_tensors"]


@pytest.mark.parametrize("path", project_model_paths() + shared_model_paths(), ids=model_id)
def test_info_runs_on_every_model(path, capsys):
    assert cli.main(["info", str(path)]) == 0
    assert cli.main(["info", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "operators:" in out


def test_a_reader_that_goes_away_ends_info_quietly(model_path):
    # `tflite_tools info MODEL | head -1`: the pipe closes early; no error line, a shell's SIGPIPE status.
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "tflite_tools", "info", str(model_path("transformer_encoder"))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err
