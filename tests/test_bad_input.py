"""Bad input gets one clear line and exit code 2; nothing is left half-written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

import tflite_tools
from tflite_tools import ModelError, cli
from tflite_tools.model import schema
from tflite_tools.model.atomic import atomic_writer

fb = schema.fb


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tflite_tools", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(capsys, argv: list[str], *fragments: str) -> str:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tflite_tools: error: ")
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def raw_model(path: Path):
    data = path.read_bytes()
    return fb.ModelT.InitFromBuf(data, flatbuffers.encode.Get(flatbuffers.packer.uoffset, data, 0))


def pack(raw, identifier: bytes = schema.FILE_IDENTIFIER) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(raw.Pack(builder), file_identifier=identifier)
    return bytes(builder.Output())


# -- files that are not models ---------------------------------------------------------------


def test_missing_path(capsys, tmp_path):
    assert_one_line_error(capsys, ["info", str(tmp_path / "nope.tflite")], "no such file")


def test_directory(capsys, tmp_path):
    assert_one_line_error(capsys, ["info", str(tmp_path)], "is a directory")


def test_empty_file(capsys, tmp_path):
    path = tmp_path / "empty.tflite"
    path.write_bytes(b"")
    assert_one_line_error(capsys, ["info", str(path)], "file is empty")


@pytest.mark.parametrize("fraction", [0.0001, 0.1, 0.5, 0.9])
def test_truncated_file(capsys, tmp_path, model_path, fraction):
    data = model_path("transformer_encoder").read_bytes()
    path = tmp_path / "cut.tflite"
    path.write_bytes(data[: max(1, int(len(data) * fraction))])
    line = assert_one_line_error(capsys, ["info", str(path)], str(path))
    assert any(word in line for word in ("truncated", "too small", "past the end")), line


def test_random_bytes(capsys, tmp_path):
    path = tmp_path / "noise.tflite"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert_one_line_error(capsys, ["info", str(path)], "not a TFLite model")


def test_wrong_file_identifier(capsys, tmp_path, model_path):
    data = bytearray(model_path("add_relu").read_bytes())
    data[4:8] = b"XXXX"
    path = tmp_path / "ident.tflite"
    path.write_bytes(bytes(data))
    assert_one_line_error(capsys, ["info", str(path)], "file identifier b'XXXX'", "expected b'TFL3'")


def _foreign_table(identifier: bytes) -> bytes:
    """A flatbuffer of another schema: a root table with a string, a float and a vector."""
    b = flatbuffers.Builder(256)
    name = b.CreateString("not a model at all")
    b.StartVector(4, 3, 4)
    for v in (7, 8, 9):
        b.PrependInt32(v)
    vec = b.EndVector()
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependFloat32Slot(1, 2.5, 0.0)
    b.PrependUOffsetTRelativeSlot(2, vec, 0)
    b.Finish(b.EndObject(), file_identifier=identifier)
    return bytes(b.Output())


def test_flatbuffer_of_another_schema(capsys, tmp_path):
    path = tmp_path / "other.bin"
    path.write_bytes(_foreign_table(b"ABCD"))
    assert_one_line_error(capsys, ["info", str(path)], "not a TFLite model")


def test_flatbuffer_of_another_schema_claiming_tfl3(tmp_path):
    with pytest.raises(ModelError) as err:
        tflite_tools.parse(_foreign_table(b"TFL3"), source="other.bin")
    assert "other.bin" in str(err.value)


def test_cli_subprocess_has_no_traceback(tmp_path):
    path = tmp_path / "bad.tflite"
    path.write_bytes(b"\x00" * 3)
    proc = run_cli("info", str(path))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "too small" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("path", ["/dev/zero", "fifo"])
def test_not_a_regular_file_is_refused_without_reading_it(capsys, tmp_path, path):
    if path == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    assert_one_line_error(capsys, ["info", path], "not a regular file")


# -- flatbuffers that decode but describe an impossible model --------------------------------


def corrupt(model_path, mutate) -> bytes:
    raw = raw_model(model_path("fc_softmax"))
    mutate(raw)
    return pack(raw)


CORRUPTIONS = {
    "schema version": (lambda m: setattr(m, "version", 2), "schema version 2"),
    "no subgraphs": (lambda m: setattr(m, "subgraphs", []), "no subgraphs"),
    "operator tensor index": (
        lambda m: setattr(m.subgraphs[0].operators[0], "inputs", [99, 1, 2]),
        "refers to tensor 99",
    ),
    "output index -1": (
        lambda m: setattr(m.subgraphs[0].operators[0], "outputs", [-1]),
        "refers to tensor -1",
    ),
    "graph input index": (lambda m: setattr(m.subgraphs[0], "inputs", [42]), "subgraph 0 input"),
    "opcode index": (lambda m: setattr(m.subgraphs[0].operators[1], "opcodeIndex", 9), "operator code 9"),
    "buffer index": (lambda m: setattr(m.subgraphs[0].tensors[1], "buffer", 1000), "buffer 1000"),
    "constant size": (lambda m: setattr(m.subgraphs[0].tensors[1], "shape", [10, 18]), "needs 720"),
    "negative dimension": (lambda m: setattr(m.subgraphs[0].tensors[0], "shape", [2, -17]), "negative dimension"),
    "tensor type": (lambda m: setattr(m.subgraphs[0].tensors[0], "type", 99), "unknown tensor type 99"),
    "signature subgraph": (lambda m: setattr(m.signatureDefs[0], "subgraphIndex", 3), "refers to subgraph 3"),
    "options type": (
        lambda m: setattr(m.subgraphs[0].operators[0], "builtinOptionsType", 250),
        "unknown to this schema",
    ),
    "builtin code": (lambda m: setattr(m.operatorCodes[0], "builtinCode", 9999), "unknown builtin operator code 9999"),
    "reads its own output": (
        lambda m: setattr(m.subgraphs[0].operators[1], "inputs", m.subgraphs[0].operators[1].outputs),
        "before operator 1 writes it",
    ),
    "cycle": (
        lambda m: setattr(m.subgraphs[0].operators[0], "inputs",
                          [m.subgraphs[0].operators[1].outputs[0], *m.subgraphs[0].operators[0].inputs[1:]]),
        "(a cycle, or operators out of order)",
    ),
    "two writers": (
        lambda m: setattr(m.subgraphs[0].operators[0], "outputs", m.subgraphs[0].operators[1].outputs),
        "already written by operator 0",
    ),
    "huge shape": (lambda m: setattr(m.subgraphs[0].tensors[0], "shape", [2**31 - 1] * 4), "too large"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_structural_corruption(capsys, tmp_path, model_path, case):
    mutate, fragment = CORRUPTIONS[case]
    path = tmp_path / "broken.tflite"
    path.write_bytes(corrupt(model_path, mutate))
    assert_one_line_error(capsys, ["info", str(path)], fragment)


def test_while_body_index_out_of_range(model_path):
    raw = raw_model(model_path("while_loop"))
    (while_op,) = [op for op in raw.subgraphs[0].operators if op.builtinOptions is not None]
    while_op.builtinOptions.bodySubgraphIndex = 7
    with pytest.raises(ModelError, match="bodySubgraphIndex 7 is out of range"):
        tflite_tools.parse(pack(raw))


# -- valid but unusual models load and are flagged -------------------------------------------


@pytest.mark.parametrize(
    "stem, flag",
    [
        ("custom_op", "custom ops: DnnfTestCustom"),
        ("dynamic_batch", "dynamic dimensions"),
        ("dynamic_batch_matmul", "dynamic dimensions"),
        ("while_loop", "control flow: WHILE"),
    ],
)
def test_unusual_models_load_and_are_flagged(capsys, model_path, stem, flag):
    assert cli.main(["info", str(model_path(stem))]) == 0
    out = capsys.readouterr().out
    flags = [line for line in out.splitlines() if line.startswith("flags:")]
    assert flags and flag in flags[0]


@pytest.mark.parametrize("command", [["run"], ["bench", "--runs", "1"]])
def test_model_stock_litert_cannot_prepare_is_one_line(capsys, model_path, command):
    # LiteRT's unresolved-custom-op text runs over two lines; the tools print one.
    line = assert_one_line_error(capsys, [command[0], str(model_path("custom_op")), *command[1:]],
                                 "unresolved custom op: DnnfTestCustom", "failed to prepare")
    assert "  " not in line


def test_model_error_texts_are_folded_onto_one_line():
    assert str(ModelError("first line\n  second\tline ")) == "first line second line"


# -- writes are atomic -----------------------------------------------------------------------


def _unsaveable_model():
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [2])
    y = b.op("RELU", [x], [2])
    b.output(y)
    model = b.build()
    model.main.tensors.remove(y)  # an operator now writes a tensor the subgraph does not list
    return model


def test_failed_save_leaves_target_untouched(tmp_path):
    target = tmp_path / "out.tflite"
    target.write_bytes(b"previous contents")
    with pytest.raises(ModelError, match="not in the subgraph"):
        tflite_tools.save(_unsaveable_model(), target)
    assert target.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tflite"]


def test_failure_during_write_removes_temporary(tmp_path, monkeypatch, model_path):
    target = tmp_path / "out.tflite"

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(ModelError, match="No space left on device"):
        tflite_tools.save(tflite_tools.load(model_path("add_relu")), target)
    assert list(tmp_path.iterdir()) == []


def test_save_into_missing_directory_is_a_model_error(tmp_path, model_path):
    with pytest.raises(ModelError, match="cannot write"):
        tflite_tools.save(tflite_tools.load(model_path("add_relu")), tmp_path / "no" / "such" / "dir.tflite")


def test_atomic_writer_exception_keeps_old_file(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_writer(target) as handle:
            handle.write(b"half of the new")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_saved_file_has_normal_permissions(tmp_path, model_path):
    target = tmp_path / "perm.tflite"
    tflite_tools.save(tflite_tools.load(model_path("add_relu")), target)
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_tensor_halide_cannot_address_gets_no_kernel():
    # A kernel over a buffer of 2^31 bytes or more could only fail Halide's size assertion at run time.
    from halide_gen.block import build_block
    from halide_gen.lower import LoweringError

    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 2**29])  # 2 GiB of float32
    y = b.op("RELU", [x], [1, 2**29])
    b.output(y)
    model = b.build()
    with pytest.raises(LoweringError, match="over what a Halide buffer can address"):
        build_block("huge", model.main.operators, model.main.outputs)


def test_version_names_the_installed_package():
    import tflite_tools

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"dnnfusion {tflite_tools.__version__}"
    assert tflite_tools.__version__ != "0+unknown"  # the package is installed, with its version
