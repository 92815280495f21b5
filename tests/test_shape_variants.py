"""Models resized after loading: open dimensions are compiled at the model's static shape, `fuse
--shape` compiles the kernels at other input shapes too, and a model resized to one of them runs
those kernels (the delegate claims again, or a partition takes another graph's kernels where
TFLite keeps it across the resize), at any other shape TFLite's kernels, and always LiteRT's
answer. A resize never leaves the model unrunnable."""

from __future__ import annotations

import gc
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import tflite_tools
from test_bad_input import assert_one_line_error
from tflite_tools import cli, runtime
from tflite_tools.fuse import fuse
from tflite_tools.model.errors import ModelError
from tflite_tools.model.reader import load
from tflite_tools.model.variants import parse_variant, resolve
from tflite_tools.run import compare, read_claims, reference_resolver, run


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.mark.parametrize("text, why", [
    ("x", "expected [SIGNATURE:]INPUT=DIMS"),
    ("x=1x", "expected [SIGNATURE:]INPUT=DIMS"),
    ("x=4,8", "expected [SIGNATURE:]INPUT=DIMS"),
    ("x=1x0x3", "has a dimension of 0"),
    ("x=1x2,x=1x3", "named twice"),
])
def test_a_shape_variant_that_cannot_be_read_is_refused_with_the_reason(text, why):
    with pytest.raises(ModelError, match=re.escape(why)):
        parse_variant(text)


@pytest.mark.parametrize("stem, text, found", [
    ("dynamic_batch_matmul", "x=4x8", (0, [[4, 8]])),  # the entry signature's input key
    ("dynamic_batch_matmul", "serving_default_x:0=2x8", (0, [[2, 8]])),  # the tensor name, colon and all
    ("decoder_signatures", "prefill_8:x=1x12x16", (2, [[1, 12, 16]])),  # another signature's input
])
def test_a_shape_variant_names_an_input_by_signature_key_or_tensor_name(model_path, stem, text, found):
    index, inputs = resolve(load(model_path(stem)), parse_variant(text))
    assert (index, [list(d) for d in inputs.values()]) == found


@pytest.mark.parametrize("stem, text, why", [
    ("dynamic_batch_matmul", "y=4x8", "has no input 'y' (inputs: serving_default_x:0, serving_default:x)"),
    ("dynamic_batch_matmul", "x=4x8x1", "has rank 2, not 3"),
    ("decoder_signatures", "prefill_8:x=1x12x16,decode:x=1x2x16", "names inputs of two subgraphs"),
])
def test_a_shape_variant_naming_what_the_model_lacks_is_refused(model_path, stem, text, why):
    with pytest.raises(ModelError, match=re.escape(why)):
        resolve(load(model_path(stem)), parse_variant(text))


def test_fuse_refuses_shapes_litert_cannot_prepare_in_one_line_and_writes_nothing(capsys, model_path, tmp_path):
    # A fully connected layer of 16 inputs fed 7 features: LiteRT's own prepare says no.
    out = tmp_path / "out"
    assert_one_line_error(capsys, ["fuse", str(model_path("decoder_signatures")), "-o", str(out),
                                   "--shape", "prefill_8:x=1x8x7"],
                          "--shape 'prefill_8:x=1x8x7': LiteRT cannot prepare the model at these shapes")
    assert not out.exists()
    assert_one_line_error(capsys, ["fuse", str(model_path("dynamic_batch_matmul")), "--plan-only", "--shape", "x=2x8"],
                          "--plan-only")


def _resize_and_match(interp, reference, shape: list[int], seed: int) -> None:
    """Resizes the first input of both interpreters to `shape`, runs both on the same random
    inputs, and asserts the outputs agree."""
    for it in (interp, reference):
        it.resize_tensor_input(it.get_input_details()[0]["index"], shape)
        it.allocate_tensors()
    inputs = runtime.random_inputs(interp, seed=seed)
    errors = compare(runtime.run(interp, inputs), runtime.run(reference, inputs), ["y"])
    assert all(e.ok for e in errors), (shape, errors)


def _profile_calls(profile: Path) -> Counter:
    calls: Counter = Counter()
    for line in profile.read_text().splitlines() if profile.exists() else []:
        entry = json.loads(line)
        calls[entry["block"]] += entry["calls"]
    return calls


@pytest.mark.parametrize("stem, shapes, runs", [
    # Open batch, no run-time shapes: TFLite undoes the delegation on a resize and the delegate
    # claims again, choosing the graph whose shapes agree.
    ("dynamic_batch_matmul", ["x=4x8"], [[4, 8], [1, 8], [3, 8], [4, 8], [1, 8]]),
    # Open batch and sequence, with reshapes LiteRT sizes only as the model runs: TFLite keeps the
    # partitions across a resize, and each takes the kernels compiled for its new shapes.
    ("encoder_open_shapes", ["x=1x16x32", "x=2x16x32"],
     [[1, 16, 32], [2, 16, 32], [1, 5, 32], [1, 1, 32], [1, 16, 32]]),
])
def test_a_model_resized_to_compiled_shapes_runs_their_kernels_and_matches(model_path, kernel_cache, tmp_path,
                                                                           stem, shapes, runs):
    result = fuse(model_path(stem), tmp_path / "out", cache_dir=kernel_cache, shapes=shapes)
    assert [v.prefix for v in result.variants] == [f"shape{k}." for k in range(1, len(shapes) + 1)]
    own = {k.block for k in result.kernels if k.kernel and k.shapes is None}
    assert own
    # The report counts the nodes blocks replace once, whatever the shapes they are compiled at.
    assert result.claimable_nodes == len({(k.subgraph, n) for k in result.kernels if k.kernel for n in k.nodes})
    # Every block with a kernel at the model's shapes has one at each variant's.
    for variant in result.variants:
        assert {k.block.removeprefix(variant.prefix) for k in result.kernels
                if k.kernel and k.shapes == variant.shapes} == own
    profile = tmp_path / "profile.jsonl"
    d = runtime.load_delegate(str(result.library), options={"claim": "all", "profile": str(profile)})
    interp = runtime.make_interpreter(result.model, delegates=[d])
    reference = runtime.make_interpreter(result.model, reference_resolver(result.model))
    for seed, shape in enumerate(runs):
        _resize_and_match(interp, reference, shape, seed)
    del interp, d
    gc.collect()
    # Each graph's kernels ran once per run at its shapes; at shapes no graph was compiled for, only
    # kernels that run on windows of a resized model's steps (test_windows.py) ran, once a run at
    # most; a block whose shapes no resize changes (one kernel in every graph) ran at every run.
    kernel = {k.block: k.kernel for k in result.kernels}
    fixed = {b for b in own if all(kernel[v.prefix + b] == kernel[b] for v in result.variants)}
    calls = Counter()
    for block, n in _profile_calls(profile).items():
        base = block.split(".", 1)[1] if block.startswith("shape") else block
        calls[base if base in fixed else block] += n
    expected = Counter({b: len(runs) for b in fixed})
    static = list(load(model_path(stem)).subgraphs[0].inputs[0].shape)
    windowed = {k.block for k in result.kernels if k.windows}
    others = 0
    for shape in runs:
        prefix = next((v.prefix for v in result.variants if v.shapes.endswith("=" + "x".join(map(str, shape)))),
                      "" if shape == static else None)
        others += prefix is None
        for block in own - fixed if prefix is not None else ():
            expected[prefix + block] += 1
    extra = calls - expected
    assert not expected - calls and len(fixed) < len(own)
    assert all(block in windowed | fixed and n <= others for block, n in extra.items()), extra


@pytest.mark.parametrize("claim", ["all", "none"])
@pytest.mark.parametrize("resolver", ["xnnpack", "builtin"])
def test_a_block_declined_after_a_resize_goes_to_tflite_and_comes_back(model_path, kernel_cache, tmp_path,
                                                                       claim, resolver):
    # TFLite undoes a delegation without clearing the tensors it marked as a delegate's: unless the
    # delegate clears them, XNNPACK is refused the node the delegate declines at the new shape (and
    # the delegate the node XNNPACK took, on the way back), and the model cannot be prepared at all.
    # Its block transposes the batch away, so no other batch runs its kernel (test_windows.py).
    rng = np.random.default_rng(5)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 8], shape_signature=[-1, 8])
    y = b.op("BATCH_MATMUL", [x, b.const("w", rng.standard_normal((8, 6)).astype(np.float32))], [1, 6])
    b.output(b.op("TRANSPOSE", [y, b.const("perm", np.array([1, 0], np.int32))], [6, 1]))
    tflite_tools.save(b.build(), tmp_path / "transposed_batch.tflite")
    result = fuse(tmp_path / "transposed_batch.tflite", tmp_path / "out", cache_dir=kernel_cache)
    report = tmp_path / "claims.jsonl"
    d = runtime.load_delegate(str(result.library), options={"claim": claim, "report": str(report)})
    interp = runtime.make_interpreter(result.model, resolver, delegates=[d])
    reference = runtime.make_interpreter(result.model, reference_resolver(result.model))
    claimed = []
    for seed, shape in enumerate(([1, 8], [3, 8], [1, 8], [2, 8])):
        _resize_and_match(interp, reference, shape, seed)
        claimed.append(bool(read_claims(report)["claimed_nodes"]))
    assert claimed == ([True, False, True, False] if claim == "all" else [False] * 4)


def test_a_signature_resized_to_its_variant_runs_its_kernels(kernel_cache, tmp_path, model_path):
    result = fuse(model_path("decoder_signatures"), tmp_path / "out", cache_dir=kernel_cache,
                  shapes=["prefill_8:x=1x3x16"])
    assert [v.name for v in result.variants] == ["prefill_8@x=1x3x16"]
    report = tmp_path / "claims.jsonl"
    d = runtime.load_delegate(str(result.library), options={"claim": "all", "report": str(report)})
    ours = runtime.make_interpreter(result.model, delegates=[d]).get_signature_runner("prefill_8")
    reference = runtime.make_interpreter(result.model, reference_resolver(result.model)).get_signature_runner("prefill_8")
    x = np.random.default_rng(5).standard_normal((1, 3, 16)).astype(np.float32)
    errors = compare([ours(x=x)["y"]], [reference(x=x)["y"]], ["y"])
    assert all(e.ok for e in errors), errors
    claims = [json.loads(line) for line in report.read_text().splitlines()]
    resized = [c for c in claims if c.get("subgraph_name") == "prefill_8@x=1x3x16"]
    assert resized and resized[-1]["claimed_blocks"] and \
        all(b.startswith("prefill_8.shape1.") for b in resized[-1]["claimed_blocks"])


def test_plan_and_report_list_the_shape_variants(kernel_cache, tmp_path, model_path):
    result = fuse(model_path("dynamic_batch_matmul"), tmp_path / "out", cache_dir=kernel_cache, shapes=["x=4x8"])
    plan = json.loads(result.plan_json.read_text())
    assert plan["variants"] == [{"index": 0, "name": "serving_default@x=4x8", "shapes": "x=4x8",
                                 "prefix": "shape1."}]
    assert {k["block"]: k["shapes"] for k in plan["kernels"]} == {"block_000": None, "shape1.block_000": "x=4x8"}
    assert "`serving_default@x=4x8` (blocks `shape1.block_NNN`)" in result.report_md.read_text()


def test_tensors_sized_from_an_open_batch_take_the_shapes_litert_gives_them(kernel_cache, tmp_path):
    # Converters write 1 for every open dimension, also where a size is a product with one: the rows
    # of a flattened batch of 4 x 8 are [4, 8] at batch 1, not the [1, 8] written. Kernels are built
    # at LiteRT's shapes, so the delegate claims them.
    from tflite_tools import serialize
    from tflite_tools.model.builder import ModelBuilder

    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input("x", [1, 4, 8], shape_signature=[-1, 4, 8])
    rows = b.op("RESHAPE", [x, b.const("rows", np.array([-1, 8], np.int32))], [1, 8])  # as a converter writes it
    rows.shape_signature = (-1, 8)
    y = b.op("FULLY_CONNECTED", [rows, b.const("w", rng.standard_normal((6, 8)).astype(np.float32)),
                                 b.const("bias", rng.standard_normal(6).astype(np.float32))], [1, 6],
             fused_activation_function="RELU")
    y.shape_signature = (-1, 6)
    b.output(y)
    path = tmp_path / "flatten.tflite"
    path.write_bytes(serialize(b.build()))
    result = fuse(path, tmp_path / "out", cache_dir=kernel_cache)
    assert [k.kernel is not None for k in result.kernels] == [True]
    outcome = run(result.model, delegate=result.library, options={"claim": "all"}, seed=1)
    assert outcome.ok and outcome.claims["claimed_nodes"] == [0, 1], outcome.claims
