"""Models with several signatures (a decoder's prefill and decode): every subgraph is planned,
compiled and claimed, each signature matches LiteRT's reference, kernels are shared where blocks
agree, and a subgraph the delegate could mistake for another that computes something else is
left to TFLite."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tflite_tools
from delegate_checks import planned_nodes
from tflite_tools import runtime
from tflite_tools.fuse import FuseResult, fuse
from tflite_tools.model.ir import Signature
from tflite_tools.model.schema import fb
from tflite_tools.run import compare, read_claims, reference_resolver

MODEL = Path(__file__).parent / "models" / "decoder_signatures.tflite"
SIGNATURES = ("decode", "prefill_16", "prefill_8")  # subgraphs 0, 1, 2


def _run_signatures(model: Path, library: Path | None, report: Path, inputs: dict[str, np.ndarray] | None = None
                    ) -> dict[str, np.ndarray]:
    """Each signature's output `y` on seeded inputs (or `inputs` by signature), with the library
    as delegate (claim:all) or with LiteRT's reference kernels."""
    if library is None:
        interp = runtime.make_interpreter(model, reference_resolver(model))
    else:
        d = runtime.load_delegate(str(library), options={"report": str(report), "claim": "all"})
        interp = runtime.make_interpreter(model, delegates=[d])
    outputs = {}
    for name in SIGNATURES:
        runner = interp.get_signature_runner(name)
        shape = runner.get_input_details()["x"]["shape"]
        x = (inputs or {}).get(name)
        if x is None:
            x = np.random.default_rng(len(name)).standard_normal(shape).astype(np.float32)
        outputs[name] = runner(x=x)["y"]
    return outputs


def _assert_signatures_match(result: FuseResult, tmp_path: Path) -> dict:
    report = tmp_path / "claims.jsonl"
    ours = _run_signatures(result.model, result.library, report)
    reference = _run_signatures(result.model, None, report)
    for name in SIGNATURES:
        errors = compare([ours[name]], [reference[name]], [name])
        assert all(e.ok for e in errors), errors
    return read_claims(report)


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory) -> Path:
    """One compile cache for the module: the signatures' models share blocks."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory, kernel_cache) -> FuseResult:
    return fuse(MODEL, tmp_path_factory.mktemp("decoder") / "out", cache_dir=kernel_cache)


def test_every_signature_is_fused_claimed_and_matches(decoder, tmp_path):
    assert {k.subgraph for k in decoder.kernels if k.kernel} == {0, 1, 2}
    claims = _assert_signatures_match(decoder, tmp_path)
    for index, name in enumerate(SIGNATURES):
        line = claims["subgraphs"][name]
        assert line["subgraph"] == index and line["declined"] == []
        assert line["claimed_nodes"] == planned_nodes(decoder, index)


def test_blocks_of_other_subgraphs_are_named_after_their_signature(decoder):
    plan = json.loads(decoder.plan_json.read_text())
    names = {k["block"] for k in plan["kernels"] if k["subgraph"] == 1}
    assert names and all(n.startswith("prefill_16.block_") for n in names)
    assert [s["name"] for s in plan["subgraphs"]] == ["prefill_16", "prefill_8"]
    assert all(s["blocks"] for s in plan["subgraphs"])
    assert "### Subgraph 2: prefill_8" in decoder.report_md.read_text()


def test_blocks_identical_across_signatures_share_one_kernel(tmp_path, kernel_cache):
    # A model whose second signature is a copy of the first: every block has its twin's identity.
    model = tflite_tools.load(MODEL)
    decode = next(s for s in model.signatures if s.subgraph_index == 0)
    model.subgraphs = model.subgraphs[:1] * 2
    model.signatures = [decode, Signature("decode_again", 1, decode.inputs, decode.outputs)]
    path = tmp_path / "twice.tflite"
    tflite_tools.save(model, path)
    result = fuse(path, tmp_path / "out", cache_dir=kernel_cache)
    kernels = [k.kernel for k in result.kernels if k.kernel]
    assert len(kernels) == 2 * len(set(kernels)) > 0


def _with_activation(model_path: Path, subgraph: int, activation: int, out: Path) -> Path:
    """The model with the first FULLY_CONNECTED of `subgraph` given another fused activation:
    the same operators and shapes, another function."""
    model = tflite_tools.load(model_path)
    fc = next(op for op in model.subgraphs[subgraph].operators if op.name == "FULLY_CONNECTED")
    assert fc.options.fusedActivationFunction != activation
    fc.options.fusedActivationFunction = activation
    tflite_tools.save(model, out)
    return out


def test_a_block_the_delegate_could_run_on_nodes_computing_something_else_is_left_to_tflite(tmp_path, kernel_cache):
    # prefill_8 gets RELU6 where prefill_16 and decode have RELU: the delegate, which sees builtin
    # codes, tensor indices and shapes, would run one's FC kernel on another's nodes after a resize.
    # Those blocks carry no kernel in any of them; every other block keeps its kernel.
    path = _with_activation(MODEL, 2, fb.ActivationFunctionType.RELU6, tmp_path / "edited.tflite")
    fc = next(n for n, op in enumerate(tflite_tools.load(path).subgraphs[2].operators) if op.name == "FULLY_CONNECTED")
    result = fuse(path, tmp_path / "out", cache_dir=kernel_cache)
    withheld = [k for k in result.kernels if k.skipped and "could not tell its nodes" in k.skipped]
    assert {k.subgraph for k in withheld} == {0, 1, 2} and all(fc in k.nodes for k in withheld)
    assert all(k.kernel for k in result.kernels if fc not in k.nodes)
    _assert_signatures_match(result, tmp_path)
    # Resized to prefill_16's length, prefill_8 would otherwise run prefill_16's RELU kernel.
    assert _prefill_8_at_16_matches(result, tmp_path / "resized.jsonl")


def _prefill_8_at_16_matches(result: FuseResult, report: Path) -> bool:
    """Runs signature prefill_8 on a 16-token input with the delegate (claim:all) and LiteRT's
    reference kernels; True when they agree."""
    d = runtime.load_delegate(str(result.library), options={"report": str(report), "claim": "all"})
    interp = runtime.make_interpreter(result.model, delegates=[d])
    reference = runtime.make_interpreter(result.model, reference_resolver(result.model))
    x = np.random.default_rng(3).standard_normal((1, 16, 16)).astype(np.float32)
    ours = interp.get_signature_runner("prefill_8")(x=x)["y"]
    expected = reference.get_signature_runner("prefill_8")(x=x)["y"]
    return all(e.ok for e in compare([ours], [expected], ["y"]))


def test_a_prefill_resized_to_another_signatures_length_runs_that_signatures_kernels(decoder, tmp_path):
    report = tmp_path / "claims.jsonl"
    assert _prefill_8_at_16_matches(decoder, report)
    last = [json.loads(line) for line in report.read_text().splitlines()][-1]
    assert last["subgraph_name"] == "prefill_16" and last["claimed_nodes"] == planned_nodes(decoder, 1)


def test_a_kv_cache_decoder_is_claimed_whole_and_matches_at_every_position(tmp_path, kernel_cache):
    # Both signatures update the caches with DYNAMIC_UPDATE_SLICE at a run-time position; positions
    # past either end of the cache clamp, as TFLite's kernel clamps them.
    model = Path(__file__).parent / "models" / "kv_cache_decoder.tflite"
    result = fuse(model, tmp_path / "out", cache_dir=kernel_cache)
    report = tmp_path / "claims.jsonl"
    d = runtime.load_delegate(str(result.library), options={"report": str(report), "claim": "all"})
    ours = runtime.make_interpreter(result.model, delegates=[d])
    reference = runtime.make_interpreter(result.model, reference_resolver(result.model))
    rng = np.random.default_rng(0)
    for name, tokens in (("prefill", 4), ("decode", 1)):
        for position in (0, 5, 15, 40, -3):
            feed = {"x": rng.standard_normal((1, tokens, 16)).astype(np.float32),
                    "k_cache": rng.standard_normal((1, 16, 2, 8)).astype(np.float32),
                    "v_cache": rng.standard_normal((1, 16, 2, 8)).astype(np.float32),
                    "pos": np.array([position], np.int32)}
            got, expected = ours.get_signature_runner(name)(**feed), reference.get_signature_runner(name)(**feed)
            errors = compare([got[k] for k in sorted(got)], [expected[k] for k in sorted(expected)], sorted(got))
            assert all(e.ok for e in errors), (name, position, errors)
    claims = read_claims(report)["subgraphs"]
    operators = tflite_tools.load(result.model).subgraphs
    for name, index in (("decode", 0), ("prefill", 1)):
        assert claims[name]["claimed_nodes"] == list(range(len(operators[index].operators)))
    # Each block that updates the caches has its in-place form linked beside it (run where an app
    # shares a cache's input and output buffer: tests/test_in_place_updates.py).
    updating = [k for k in result.kernels if "DYNAMIC_UPDATE_SLICE" in k.ops]
    assert len(updating) == 2 and all(k.in_place_kernel and k.in_place_kernel != k.kernel for k in updating)
