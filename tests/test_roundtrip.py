"""A model loaded and saved unchanged runs bit-identically in LiteRT and keeps what it declared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tflite_tools
from tflite_tools import runtime
from conftest import NOT_RUNNABLE, model_id, shared_model_paths, project_model_paths


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_round_trip(path: Path, tmp_path: Path) -> None:
    original = path.read_bytes()
    model = tflite_tools.load(path)
    out = tmp_path / "copy.tflite"
    tflite_tools.save(model, out)
    copy = tflite_tools.load(out)

    # Structure: same ops in the same order, same tensors, signatures and metadata.
    assert len(copy.subgraphs) == len(model.subgraphs)
    for sa, sb in zip(model.subgraphs, copy.subgraphs):
        assert [op.opcode for op in sa.operators] == [op.opcode for op in sb.operators]
        assert [(t.name, t.shape, t.dtype, t.shape_signature) for t in sa.tensors] == [
            (t.name, t.shape, t.dtype, t.shape_signature) for t in sb.tensors
        ]
        for ta, tb in zip(sa.tensors, sb.tensors):
            assert (ta.data is None) == (tb.data is None)
            if ta.data is not None:
                assert ta.data.tobytes() == tb.data.tobytes()
    assert [(s.key, list(s.inputs), list(s.outputs)) for s in copy.signatures] == [
        (s.key, list(s.inputs), list(s.outputs)) for s in model.signatures
    ]
    assert copy.metadata == model.metadata
    assert copy.description == model.description

    if path.stem in NOT_RUNNABLE:
        return
    a = runtime.make_interpreter(original)
    b = runtime.make_interpreter(out)
    assert a.get_signature_list() == b.get_signature_list()
    for seed in (0, 1):
        inputs = runtime.random_inputs(a, seed)
        for x, y in zip(runtime.run(a, inputs), runtime.run(b, inputs)):
            assert _same_bits(x, y)


@pytest.mark.parametrize("path", project_model_paths(), ids=model_id)
def test_round_trip_test_models(path: Path, tmp_path: Path) -> None:
    assert_round_trip(path, tmp_path)


@pytest.mark.parametrize("path", shared_model_paths(), ids=model_id)
def test_round_trip_reference_models(path: Path, tmp_path: Path) -> None:
    assert_round_trip(path, tmp_path)


@pytest.mark.parametrize("path", project_model_paths(), ids=model_id)
def test_serialization_is_a_fixed_point(path: Path) -> None:
    once = tflite_tools.serialize(tflite_tools.load(path))
    twice = tflite_tools.serialize(tflite_tools.parse(once))
    assert once == twice


def test_constants_are_read_only_views_into_the_file(model_path) -> None:
    data = model_path("mobilenet_v2_035_96").read_bytes()
    model = tflite_tools.parse(data)
    constants = [t for t in model.main.tensors if t.is_constant]
    assert constants
    for t in constants:
        assert not t.data.flags.writeable
        assert not t.data.flags.owndata  # a view, not a copy
        assert t.data.shape == t.shape
        assert t.data.dtype == t.numpy_dtype


def test_buffers_are_16_byte_aligned(model_path, tmp_path: Path) -> None:
    model = tflite_tools.load(model_path("transformer_encoder"))
    data = tflite_tools.serialize(model)
    copy = tflite_tools.parse(data)
    base = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
    for t in copy.main.tensors:
        if t.is_constant:
            assert (t.data.__array_interface__["data"][0] - base) % 16 == 0, t.name


def test_shared_constants_stay_shared() -> None:
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [4])
    c = b.const("c", np.arange(4, dtype=np.float32))
    alias = b.tensor("alias", [4])
    alias.data = c.data  # the same memory under two names, as the converter sometimes emits
    y = b.op("ADD", [x, c], [4])
    b.output(b.op("MUL", [y, alias], [4]))
    data = tflite_tools.serialize(b.build())
    copy = tflite_tools.parse(data)
    consts = [t for t in copy.main.tensors if t.is_constant]
    assert len(consts) == 2
    assert consts[0].data.__array_interface__["data"][0] == consts[1].data.__array_interface__["data"][0]


def test_multi_subgraph_model_keeps_control_flow(model_path, tmp_path: Path) -> None:
    model = tflite_tools.load(model_path("while_loop"))
    assert len(model.subgraphs) == 3
    (while_op,) = [op for op in model.main.operators if op.name == "WHILE"]
    assert {while_op.options.condSubgraphIndex, while_op.options.bodySubgraphIndex} == {1, 2}


def test_optional_inputs_survive(model_path) -> None:
    model = tflite_tools.load(model_path("fc_no_bias"))
    (fc,) = model.main.operators
    assert fc.inputs[2] is None
    copy = tflite_tools.parse(tflite_tools.serialize(model))
    assert copy.main.operators[0].inputs[2] is None


def test_per_channel_quantization_is_kept(model_path) -> None:
    model = tflite_tools.load(model_path("mobilenet_v2_035_96_int8"))
    conv = next(op for op in model.main.operators if op.name == "CONV_2D")
    q = conv.inputs[1].quantization
    assert q.per_channel and len(q.scale) == conv.inputs[1].shape[0]
    assert q.quantized_dimension == 0
    copy = tflite_tools.parse(tflite_tools.serialize(model))
    q2 = next(op for op in copy.main.operators if op.name == "CONV_2D").inputs[1].quantization
    assert np.array_equal(q.scale, q2.scale) and np.array_equal(q.zero_point, q2.zero_point)


def test_custom_op_keeps_code_and_options(model_path) -> None:
    model = tflite_tools.load(model_path("custom_op"))
    op = model.main.operators[0]
    assert op.opcode.is_custom and op.opcode.custom_code == "DnnfTestCustom"
    assert op.custom_options == b"\x01\x02opaque"
    copy = tflite_tools.parse(tflite_tools.serialize(model)).main.operators[0]
    assert (copy.opcode, copy.custom_options) == (op.opcode, op.custom_options)


def test_non_utf8_names_round_trip() -> None:
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [2])
    y = b.op("RELU", [x], [2])
    b.output(y)
    model = b.build()
    y.name = b"caf\xe9".decode("utf-8", "surrogateescape")  # a Latin-1 name in the file
    copy = tflite_tools.parse(tflite_tools.serialize(model))
    assert copy.main.tensors[1].name == y.name


def test_buffers_stored_after_the_flatbuffer_are_read(model_path, tmp_path: Path) -> None:
    # Models over 2 GiB keep constants after the flatbuffer (Buffer.offset / size); build a small
    # one the same way and check LiteRT and the loader agree on it.
    import flatbuffers

    from tflite_tools.model.schema import FILE_IDENTIFIER, fb

    data = model_path("fc_softmax").read_bytes()
    raw = fb.ModelT.InitFromBuf(data, flatbuffers.encode.Get(flatbuffers.packer.uoffset, data, 0))
    weights_index = raw.subgraphs[0].tensors[raw.subgraphs[0].operators[0].inputs[1]].buffer
    payload = bytes(raw.buffers[weights_index].data)
    offset = 1 << 16
    raw.buffers[weights_index] = fb.BufferT(data=None, offset=offset, size=len(payload))
    builder = flatbuffers.Builder(1024)
    builder.Finish(raw.Pack(builder), file_identifier=FILE_IDENTIFIER)
    head = bytes(builder.Output())
    assert len(head) < offset
    external = head + b"\0" * (offset - len(head)) + payload
    path = tmp_path / "external.tflite"
    path.write_bytes(external)

    model = tflite_tools.load(path)
    assert model.main.operators[0].inputs[1].data.tobytes() == payload
    assert_round_trip(path, tmp_path)

    truncated = tmp_path / "truncated.tflite"
    truncated.write_bytes(external[:-1])
    with pytest.raises(tflite_tools.ModelError, match="past the end of the file"):
        tflite_tools.load(truncated)


def test_tensors_only_quantization_names_survive_pruning_reordering_and_cut_outs(model_path, tmp_path: Path) -> None:
    # Weights quantized per block name their scales tensor from their quantization, by index in
    # the file, and no operator reads it. Dropped as unused (the rewrites' prune), renumbered by a
    # reordered tensor list, or left out of a block's cut-out, the index pointed at another tensor
    # or past the end: LiteRT's optimized kernel read garbage and XNNPACK crashed the process.
    from fusion.rewrite.graph import GraphView
    from halide_gen.profile import cut_out

    path = model_path("int4_blockwise_mlp")
    model = tflite_tools.load(path)
    GraphView(model).prune()
    model.main.tensors.reverse()
    (tmp_path / "edited.tflite").write_bytes(tflite_tools.serialize(model))
    fc = next(op for op in model.main.operators if op.name == "FULLY_CONNECTED")
    cut = cut_out([fc], [fc.inputs[0]], fc.outputs)
    assert fc.inputs[1].quantization.blockwise.scales in cut.main.tensors
    (tmp_path / "cut.tflite").write_bytes(tflite_tools.serialize(cut))
    original = tflite_tools.load(path)
    original_fc = next(op for op in original.main.operators if op.name == "FULLY_CONNECTED")
    (tmp_path / "original_cut.tflite").write_bytes(tflite_tools.serialize(
        cut_out([original_fc], [original_fc.inputs[0]], original_fc.outputs)))
    for resolver in ("builtin", "xnnpack"):
        for before, after in ((path, tmp_path / "edited.tflite"), (tmp_path / "original_cut.tflite", tmp_path / "cut.tflite")):
            a, b = runtime.make_interpreter(before, resolver), runtime.make_interpreter(after, resolver)
            inputs = runtime.random_inputs(a, 0)
            for x, y in zip(runtime.run(a, inputs), runtime.run(b, inputs)):
                assert _same_bits(x, y)
    copy = tflite_tools.load(tmp_path / "edited.tflite")
    for t in copy.main.tensors:
        if t.quantization is not None and t.quantization.blockwise is not None:
            scales = t.quantization.blockwise.scales
            assert scales.name == f"{t.name}_scales" and scales.shape == (t.shape[0], t.shape[1] // 32)
