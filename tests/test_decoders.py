"""Language-model decoders as the decoder corpus builds them (bench/decoders.py), at a tiny size:
every signature (two prefills, decode) claimed whole, and greedy generation with the delegate gives
the tokens of LiteRT's reference kernels, in float, dynamic-range int8 and int4 weights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tflite_tools
from delegate_checks import planned_nodes
from tflite_tools import runtime
from tflite_tools.run import read_claims, reference_resolver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from decoders import GENERATED, greedy, prompt  # noqa: E402

MODELS = Path(__file__).parent / "models"
DECODERS = ["tiny_gemma_decoder", "tiny_llama_decoder_int4", "tiny_qwen_decoder_dynamic_range"]


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generation_matches_the_reference_and_every_signature_is_claimed_whole(name, fused, tmp_path):
    model = MODELS / f"{name}.tflite"
    result = fused(name)
    report = tmp_path / "claims.jsonl"
    ours = runtime.make_interpreter(result.model, delegates=[
        runtime.load_delegate(str(result.library), options={"report": str(report), "claim": "all"})])
    reference = runtime.make_interpreter(model, reference_resolver(model))
    words = prompt(reference)
    expected, margins = greedy(reference, words)
    assert min(margins) > 1e-3  # no near-tie a legitimate rounding could flip
    assert greedy(ours, words)[0] == expected and len(expected) == GENERATED
    claims = read_claims(report)["subgraphs"]
    assert sorted(claims) == sorted(s.key for s in tflite_tools.load(model).signatures)
    for line in claims.values():
        assert line["declined"] == [] and line["claimed_nodes"] == planned_nodes(result, line["subgraph"])
        assert len(line["claimed_nodes"]) == len(tflite_tools.load(result.model).subgraphs[line["subgraph"]].operators)


def test_signatures_that_differ_only_in_tensor_numbering_each_run_their_own_kernels(fused, tmp_path):
    # prefill_4 and prefill_8 compute the same, but the converter numbers their tensors differently
    # (prefill_8 has one more): the delegate never runs one's blocks on the other's nodes, so no
    # block is withheld and each prefill is claimed with its own graph.
    model = MODELS / "tiny_gemma_decoder.tflite"
    subgraphs = tflite_tools.load(model).subgraphs
    assert len(subgraphs[1].tensors) != len(subgraphs[2].tensors)
    result = fused(model.stem)
    assert [k.skipped for k in result.kernels if k.skipped] == []
    report = tmp_path / "claims.jsonl"
    interp = runtime.make_interpreter(result.model, delegates=[
        runtime.load_delegate(str(result.library), options={"report": str(report), "claim": "all"})])
    greedy(interp, prompt(interp), steps=1)
    claims = read_claims(report)["subgraphs"]
    assert [claims[n]["subgraph"] for n in ("decode", "prefill_4", "prefill_8")] == [0, 1, 2]
