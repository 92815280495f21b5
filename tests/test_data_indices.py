"""Indices read from data: one out of range fails the invoke with a reason, as LiteRT's kernels do,
never reads out of bounds and never returns a made-up row (GATHER, GATHER_ND, MediaPipe's
MaxUnpooling2D). ONE_HOT and EMBEDDING_LOOKUP have no lowering: TFLite runs them."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import opcheck
from halide_gen.block import build_block
from halide_gen.lower import LoweringError
from halide_gen.lowering_options import LoweringOptions
from tflite_tools import cli, runtime, serialize
from tflite_tools.model.builder import ModelBuilder


def gather_model(axis: int = 0):
    b = ModelBuilder()
    table = b.input("table", [5, 4])
    ids = b.input("ids", [3], "int32")
    out = [3, 4] if axis == 0 else [5, 3]
    b.output(b.op("GATHER", [table, ids], out, axis=axis))
    return b.build()


def gather_nd_model():
    b = ModelBuilder()
    x = b.input("x", [4, 6])
    idx = b.input("idx", [3, 2], "int32")
    b.output(b.op("GATHER_ND", [x, idx], [3]))
    return b.build()


def inputs_with(model, indices):
    table = np.arange(np.prod(model.main.inputs[0].shape), dtype=np.float32).reshape(model.main.inputs[0].shape)
    return [table, np.asarray(indices, np.int32)]


CASES = {
    "gather row past the end": (lambda: gather_model(0), [0, 5, 1], "gather index out of bounds"),
    "gather 2^31-1": (lambda: gather_model(0), [2**31 - 1, 0, 0], "gather index out of bounds"),
    "gather negative": (lambda: gather_model(0), [0, -1, 2], "gather index out of bounds"),
    "gather along axis 1": (lambda: gather_model(1), [3, 4, 0], "gather index out of bounds"),
    "gather_nd": (gather_nd_model, [[0, 1], [4, 0], [1, 1]], "gather_nd index out of bounds"),
    "gather_nd inner coordinate": (gather_nd_model, [[0, 6], [0, 0], [1, 1]], "gather_nd index out of bounds"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_out_of_range_index_fails_like_litert(case):
    make, indices, message = CASES[case]
    model = make()
    inputs = inputs_with(model, indices)
    with pytest.raises(RuntimeError, match="out of bounds"):  # LiteRT's own kernels refuse it
        opcheck.reference(model, inputs)
    with pytest.raises(Exception, match=message):
        opcheck.halide(model, inputs)


@pytest.mark.parametrize("make", [lambda: gather_model(0), lambda: gather_model(1), gather_nd_model])
def test_in_range_indices_still_match(make):
    model = make()
    indices = [[0, 5], [3, 0], [1, 1]] if model.main.operators[0].name == "GATHER_ND" else [4, 0, 2]
    inputs = inputs_with(model, np.minimum(indices, [[3, 5]] if np.ndim(indices) == 2 else 3))
    for ref, got in zip(opcheck.reference(model, inputs), opcheck.halide(model, inputs)):
        np.testing.assert_array_equal(ref, got)


def test_max_unpooling_index_outside_its_window_fails():
    b = ModelBuilder()
    values, where = b.input("v", [1, 2, 2, 3]), b.input("i", [1, 2, 2, 3])
    b.output(b.custom("MaxUnpooling2D", [values, where], [1, 4, 4, 3],
                      custom_options=struct.pack("<6i", 2, 2, 2, 2, 2, 0)))
    bits = np.zeros((1, 2, 2, 3), np.uint32)
    bits[0, 1, 0, 2] = 4  # a 2x2 window has positions 0..3
    with pytest.raises(Exception, match="MaxUnpooling2D index out of bounds"):
        opcheck.halide(b.build(), [np.ones((1, 2, 2, 3), np.float32), bits.view(np.float32)])


def test_run_reports_the_failed_invoke_in_one_line(tmp_path, capsys, monkeypatch, private_cache):
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(private_cache.parent))
    model = tmp_path / "gather.tflite"
    model.write_bytes(serialize(gather_model(0)))
    out = tmp_path / "out"
    assert cli.main(["fuse", str(model), "-o", str(out)]) == 0
    np.save(tmp_path / "table.npy", np.ones((5, 4), np.float32))
    np.save(tmp_path / "ids.npy", np.array([0, 100000, 1], np.int32))
    capsys.readouterr()
    for delegate in ([], ["--delegate", str(out / "libgather_dnnfusion.so"), "--option", "claim=all"]):
        code = cli.main(["run", str(out / "model.fused.tflite"), *delegate, "--inputs", str(tmp_path / "table.npy"),
                         str(tmp_path / "ids.npy")])
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("tflite_tools: error:")]
        assert code == 2 and len(errors) == 1 and "index out of bounds" in errors[0], err
        assert "Traceback" not in err


def _constant_gather(ids):
    b = ModelBuilder()
    table = b.input("table", [5, 4])
    b.output(b.op("GATHER", [table, b.const("ids", np.array(ids, np.int32))], [len(ids), 4], axis=0))
    return b.build()


def test_device_code_checks_constant_indices_when_it_compiles():
    # GPU kernels cannot fail an invoke (lower.movement.index_operand): constant indices are checked
    # as the block is lowered (out of range: TFLite keeps the op, and fails as it always would),
    # indices the block computes itself could only be checked on the device, so TFLite keeps those.
    def lowered(model):
        sg = model.main
        return build_block("b", sg.operators, sg.outputs, LoweringOptions(device_code=True))

    (arg,) = [a for a in lowered(gather_model(0)).arguments if a.tensor.name == "ids"]
    assert arg.index_bounds == (5,) and arg.index_op == "gather"
    assert all(not a.index_bounds for a in lowered(_constant_gather([4, 0, 2])).arguments)
    with pytest.raises(LoweringError, match="gather index out of bounds in a constant"):
        lowered(_constant_gather([4, 5, 2]))
    b = ModelBuilder()
    table, x = b.input("table", [5, 4]), b.input("x", [3])
    ids = b.op("CAST", [x], [3], dtype="int32")
    b.output(b.op("GATHER", [table, ids], [3, 4], axis=0))
    with pytest.raises(LoweringError, match="indices computed in the block"):
        lowered(b.build())
    (arg,) = [a for a in lowered(gather_nd_model()).arguments if a.tensor.name == "idx"]
    assert arg.index_bounds == (4, 6) and arg.index_op == "gather_nd"
