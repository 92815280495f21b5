"""A model resized along its batch or its sequence stays claimed: blocks whose ops keep the steps
of that direction apart run their kernels, compiled at the model's shapes, on windows of the
compiled steps (tflite_tools.windows), and give what LiteRT gives at the new shapes, and exactly
what they give window by window."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

import tflite_tools
from delegate_checks import planned_nodes
from tflite_tools import runtime
from tflite_tools.windows import carriers, window_arguments
from tflite_tools.run import compare, quantized_outputs, read_claims, reference_resolver


def _ours_and_litert(result, tmp_path):
    """The fused model with the delegate claiming all it can, LiteRT's reference for it, and the
    delegate's claims report."""
    report = tmp_path / "claims.jsonl"
    d = runtime.load_delegate(str(result.library), options={"claim": "all", "report": str(report)})
    return (runtime.make_interpreter(result.model, delegates=[d]),
            runtime.make_interpreter(result.model, reference_resolver(result.model)), report)


def _resized(batch: int, *interpreters, axis: int = 0) -> None:
    for interp in interpreters:
        for detail in interp.get_input_details():
            shape = list(detail["shape"])
            shape[axis] = batch
            interp.resize_tensor_input(detail["index"], shape)
        interp.allocate_tensors()


def _items(inputs, k: int):
    return [x[k: k + 1] for x in inputs]


@pytest.mark.parametrize("stem", ["mobilenet_v2_035_96", "transformer_encoder", "mobilenet_v2_035_96_int8",
                                  "dynamic_batch_matmul"])
def test_a_model_resized_along_its_batch_stays_claimed_and_matches(stem, fused, tmp_path):
    result = fused(stem)
    assert all("batch" in k.windows for k in result.kernels if k.kernel), [k.block for k in result.kernels if not k.windows]
    ours, reference, report = _ours_and_litert(result, tmp_path)
    batch = 3
    _resized(batch, ours, reference)
    assert read_claims(report)["claimed_nodes"] == planned_nodes(result)
    inputs = runtime.random_inputs(ours, 0)
    got = runtime.run(ours, inputs)
    errors = compare(got, runtime.run(reference, inputs), [str(k) for k in range(len(got))],
                     quantized=quantized_outputs(reference, result.model))
    assert all(e.ok for e in errors), errors
    _resized(1, ours)  # back at the compiled batch: the same kernels item by item give the same bits
    assert read_claims(report)["claimed_nodes"] == planned_nodes(result)
    for k in range(batch):
        for whole, item in zip(got, runtime.run(ours, _items(inputs, k))):
            assert whole[k: k + 1].tobytes() == item.tobytes()


def _mixing_model(op: str):
    """x [1, 8] -> FULLY_CONNECTED -> an op acting along the batch axis."""
    rng = np.random.default_rng(3)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 8], shape_signature=[-1, 8])
    y = b.op("FULLY_CONNECTED", [x, b.const("w", rng.standard_normal((6, 8)).astype(np.float32)), None], [1, 6])
    if op == "TRANSPOSE":
        out = b.op("TRANSPOSE", [y, b.const("perm", np.array([1, 0], np.int32))], [6, 1])
    else:  # a sum over the batch
        out = b.op("SUM", [y, b.const("axes", np.array([0], np.int32))], [1, 6], keep_dims=True)
    b.output(out)
    return b.build()


@pytest.mark.parametrize("op", ["TRANSPOSE", "SUM"])
def test_a_block_acting_across_items_runs_only_at_its_batch_and_tflite_runs_it_at_others(op, tmp_path, kernel_cache):
    from tflite_tools.fuse import fuse

    path = tmp_path / "mixing.tflite"
    tflite_tools.save(_mixing_model(op), path)
    result = fuse(path, tmp_path / "out", cache_dir=kernel_cache)
    (mixing,) = [k for k in result.kernels if op in k.ops]
    assert mixing.kernel and "batch" not in mixing.windows
    ours, reference, report = _ours_and_litert(result, tmp_path)
    for seed, batch in enumerate((1, 3, 1)):
        _resized(batch, ours, reference)
        claimed = read_claims(report)["claimed_nodes"]
        assert claimed == [n for n in planned_nodes(result) if batch == 1 or n not in mixing.nodes], batch
        inputs = runtime.random_inputs(ours, seed)
        errors = compare(runtime.run(ours, inputs), runtime.run(reference, inputs), ["y"])
        assert all(e.ok for e in errors), (batch, errors)


@pytest.mark.parametrize("direction, case, windowed", [
    (0, "concatenation along the batch", False),
    (0, "concatenation along the channels", True),
    (0, "a reversal along the batch", False),
    (0, "a transpose keeping the batch first", True),
    (0, "a table gathered for each step's ids", True),
    (1, "concatenation along the sequence", False),
    (1, "concatenation along the channels", True),
    (1, "a sum over the sequence", False),
    (1, "a softmax along the channels", True),
    (1, "a reshape keeping the steps outermost", True),
    (1, "a transpose moving the sequence last", False),  # each step's elements apart in memory
    (1, "a transpose there and back", True),
    (1, "a product of the sequence with itself", False),
    (1, "a table gathered for each step's ids", True),
])
def test_which_ops_keep_steps_apart(direction, case, windowed):
    # LiteRT sizes the subgraph with the direction's axis doubled; each op's rule says whether it
    # mixes the steps, and the kernel's arguments must hold each step in one run of memory.
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 4, 8])
    seq = [1, 4, 8] if direction == 1 else None
    if case.startswith("concatenation"):
        axis = 2 if "channels" in case else direction
        shape = [1, 4, 16] if axis == 2 else [2, 4, 8] if axis == 0 else [1, 8, 8]
        out = b.op("CONCATENATION", [x, x], shape, axis=axis)
    elif case.startswith("a reversal"):
        out = b.op("REVERSE_V2", [x, b.const("axis", np.array([0], np.int32))], [1, 4, 8])
    elif case.startswith("a transpose keeping"):
        out = b.op("TRANSPOSE", [x, b.const("perm", np.array([0, 2, 1], np.int32))], [1, 8, 4])
    elif case.startswith("a sum"):
        out = b.op("SUM", [x, b.const("axes", np.array([1], np.int32))], [1, 1, 8], keep_dims=True)
    elif case.startswith("a softmax"):
        out = b.op("SOFTMAX", [x], seq, beta=1.0)
    elif case.startswith("a reshape"):
        out = b.op("RESHAPE", [x, b.const("shape", np.array([-1, 8], np.int32))], [4, 8])
    elif case.startswith("a transpose"):
        perm = b.const("perm", np.array([0, 2, 1], np.int32))
        out = b.op("TRANSPOSE", [x, perm], [1, 8, 4])
        if "back" in case:
            out = b.op("TRANSPOSE", [out, perm], seq)
    elif case.startswith("a product"):
        out = b.op("BATCH_MATMUL", [x, x], [1, 4, 4], adj_y=True)
    else:
        ids = b.input("ids", [1, 5], "int32")
        out = b.op("ADD", [b.op("GATHER", [b.const("table", np.ones((10, 8), np.float32)), ids], [1, 5, 8], axis=0),
                           b.const("one", np.ones(8, np.float32))], [1, 5, 8])
    b.output(out)
    model = b.build()
    sg = model.main
    found = carriers(sg, tflite_tools.serialize(model), 0, direction)
    produced = {id(t) for op in sg.operators for t in op.outputs}
    arguments = [t for op in sg.operators for t in op.inputs if t is not None and id(t) not in produced]
    answer = window_arguments(sg.operators, arguments, sg.outputs, found)
    assert (answer is not None) == windowed, found


def _row_model(steps: int = 16):
    """x [1, steps, 8], its sequence open -> FULLY_CONNECTED -> GELU -> FULLY_CONNECTED -> + x ->
    SOFTMAX: every op acts on each step alone."""
    rng = np.random.default_rng(5)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, steps, 8], shape_signature=[1, -1, 8])
    up = b.op("FULLY_CONNECTED", [x, b.const("up", rng.standard_normal((12, 8)).astype(np.float32)), None],
              [1, steps, 12], keep_num_dims=True)
    down = b.op("FULLY_CONNECTED", [b.op("GELU", [up], [1, steps, 12]),
                                    b.const("down", rng.standard_normal((8, 12)).astype(np.float32)), None],
                [1, steps, 8], keep_num_dims=True)
    b.output(b.op("SOFTMAX", [b.op("ADD", [down, x], [1, steps, 8])], [1, steps, 8], beta=1.0))
    return b.build()


@pytest.mark.parametrize("steps", [40, 16, 5, 1, 33])
def test_a_model_resized_along_its_sequence_runs_its_kernels_on_windows_and_matches(steps, tmp_path, kernel_cache):
    from tflite_tools.fuse import fuse

    path = tmp_path / "rows.tflite"
    tflite_tools.save(_row_model(), path)
    result = fuse(path, tmp_path / "out", cache_dir=kernel_cache)
    assert all("sequence" in k.windows for k in result.kernels if k.kernel)
    ours, reference, report = _ours_and_litert(result, tmp_path)
    _resized(steps, ours, reference, axis=1)
    assert read_claims(report)["claimed_nodes"] == planned_nodes(result)
    x = runtime.random_inputs(ours, 0)[0]
    got = runtime.run(ours, [x])[0]
    errors = compare([got], runtime.run(reference, [x]), ["y"])
    assert all(e.ok for e in errors), errors
    # Each step is what the kernel gives that step at the compiled length, whichever window held it.
    _resized(16, ours, axis=1)
    for start in range(0, steps, 7):
        window = np.zeros((1, 16, 8), np.float32)
        rows = x[:, start: start + 16]
        window[:, : rows.shape[1]] = rows
        alone = runtime.run(ours, [window])[0]
        assert alone[:, : rows.shape[1]].tobytes() == got[:, start: start + 16].tobytes(), start


@pytest.mark.parametrize("runs", [[40, 16, 5, 16, 100]])
def test_an_encoder_resized_along_its_sequence_keeps_its_row_blocks_and_matches(runs, model_path, kernel_cache,
                                                                                tmp_path):
    # Compiled at 16 tokens (the converter writes 1 for the open length): the projections, the
    # feed-forward and the normalization run on windows of 16 at any length; attention mixes the
    # tokens, so at another length TFLite runs it.
    from tflite_tools.fuse import fuse

    result = fuse(model_path("encoder_open_sequence"), tmp_path / "out", cache_dir=kernel_cache,
                  shapes=["x=1x16x32"])
    variant = [k for k in result.kernels if k.kernel and k.shapes is not None]
    rows = {k.block for k in variant if "sequence" in k.windows}
    mixing = [n for k in variant if k.block not in rows for n in k.nodes]
    assert rows and mixing and sum(len(k.nodes) for k in variant if k.block in rows) > len(mixing)
    report_md = (tmp_path / "out" / "report.md").read_text()
    windowed = sum("sequence" in k.windows for k in result.kernels if k.kernel)
    assert f"along the sequence, {windowed} of {sum(bool(k.kernel) for k in result.kernels)}" in report_md
    report, profile = tmp_path / "claims.jsonl", tmp_path / "profile.jsonl"
    d = runtime.load_delegate(str(result.library), options={"claim": "all", "report": str(report),
                                                            "profile": str(profile)})
    ours = runtime.make_interpreter(result.model, delegates=[d])
    reference = runtime.make_interpreter(result.model, reference_resolver(result.model))
    for seed, steps in enumerate(runs):
        _resized(steps, ours, reference, axis=1)
        claimed = read_claims(report)["claimed_nodes"]
        assert claimed == sorted(n for k in variant for n in k.nodes if steps == 16 or k.block in rows), steps
        inputs = runtime.random_inputs(ours, seed)
        errors = compare(runtime.run(ours, inputs), runtime.run(reference, inputs), ["y"])
        assert all(e.ok for e in errors), (steps, errors)
    del ours, d
    gc.collect()
    # Every length ran the kernels compiled at 16 tokens, never the model's own (1 token: a window
    # per token, the weights read again for each).
    ran = {json.loads(line)["block"] for line in profile.read_text().splitlines()}
    assert ran and all(block.startswith("shape1.") for block in ran), ran
