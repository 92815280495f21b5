"""A model resized along its batch stays claimed: blocks whose ops keep the items of a batch apart
run their kernels, compiled at the model's batch, once per item (tflite_tools.batch_items),
and give what LiteRT gives at that batch, and exactly what they give item by item."""

from __future__ import annotations

import numpy as np
import pytest

import tflite_tools
from delegate_checks import planned_nodes
from tflite_tools import runtime
from tflite_tools.batch_items import batch_carriers, per_item_arguments
from tflite_tools.run import compare, quantized_outputs, read_claims, reference_resolver


def _ours_and_litert(result, tmp_path):
    """The fused model with the delegate claiming all it can, LiteRT's reference for it, and the
    delegate's claims report."""
    report = tmp_path / "claims.jsonl"
    d = runtime.load_delegate(str(result.library), options={"claim": "all", "report": str(report)})
    return (runtime.make_interpreter(result.model, delegates=[d]),
            runtime.make_interpreter(result.model, reference_resolver(result.model)), report)


def _resized(batch: int, *interpreters) -> None:
    for interp in interpreters:
        for detail in interp.get_input_details():
            interp.resize_tensor_input(detail["index"], [batch, *detail["shape"][1:]])
        interp.allocate_tensors()


def _items(inputs, k: int):
    return [x[k: k + 1] for x in inputs]


@pytest.mark.parametrize("stem", ["mobilenet_v2_035_96", "transformer_encoder", "mobilenet_v2_035_96_int8",
                                  "dynamic_batch_matmul"])
def test_a_model_resized_along_its_batch_stays_claimed_and_matches(stem, fused, tmp_path):
    result = fused(stem)
    assert all(k.per_item for k in result.kernels if k.kernel), [k.block for k in result.kernels if not k.per_item]
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
    assert mixing.kernel and not mixing.per_item
    ours, reference, report = _ours_and_litert(result, tmp_path)
    for seed, batch in enumerate((1, 3, 1)):
        _resized(batch, ours, reference)
        claimed = read_claims(report)["claimed_nodes"]
        assert claimed == [n for n in planned_nodes(result) if batch == 1 or n not in mixing.nodes], batch
        inputs = runtime.random_inputs(ours, seed)
        errors = compare(runtime.run(ours, inputs), runtime.run(reference, inputs), ["y"])
        assert all(e.ok for e in errors), (batch, errors)


@pytest.mark.parametrize("case, per_item", [
    ("concatenation along the batch", False),
    ("concatenation along the channels", True),
    ("a reversal along the batch", False),
    ("a transpose keeping the batch first", True),
    ("a table gathered for each item's ids", True),
])
def test_which_ops_keep_items_apart(case, per_item):
    # LiteRT sizes the subgraph at twice the batch; each op's rule says whether it mixes items.
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 4, 8])
    if case.startswith("concatenation"):
        axis = 0 if "batch" in case else 2
        out = b.op("CONCATENATION", [x, x], [2, 4, 8] if axis == 0 else [1, 4, 16], axis=axis)
    elif case.startswith("a reversal"):
        out = b.op("REVERSE_V2", [x, b.const("axis", np.array([0], np.int32))], [1, 4, 8])
    elif case.startswith("a transpose"):
        out = b.op("TRANSPOSE", [x, b.const("perm", np.array([0, 2, 1], np.int32))], [1, 8, 4])
    else:
        ids = b.input("ids", [1, 5], "int32")
        out = b.op("ADD", [b.op("GATHER", [b.const("table", np.ones((10, 8), np.float32)), ids], [1, 5, 8], axis=0),
                           b.const("one", np.ones(8, np.float32))], [1, 5, 8])
    b.output(out)
    model = b.build()
    sg = model.main
    carriers = batch_carriers(model, tflite_tools.serialize(model), 0)
    produced = {id(t) for op in sg.operators for t in op.outputs}
    arguments = [t for op in sg.operators for t in op.inputs if t is not None and id(t) not in produced]
    answer = per_item_arguments(sg.operators, arguments, sg.outputs, carriers)
    assert (answer is not None) == per_item, carriers
