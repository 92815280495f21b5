"""The ARM64 cost measure (bench/arm_count.py): its qemu plugin builds, and per-invoke counts of the
same cases are reproducible, in one emulated process and across processes."""

from __future__ import annotations

import sys

from conftest import MODELS, REPO

sys.path.insert(0, str(REPO / "bench"))

import arm_count  # noqa: E402


def test_counts_are_reproducible_and_see_the_delegate(arm64_root, pipeline_models, tmp_path):
    row = arm_count.model_counts(MODELS / "unet_tiny.tflite", "cortex-a76", tmp_path, invokes=2)
    again = arm_count.model_counts(MODELS / "unet_tiny.tflite", "cortex-a76", tmp_path / "again", invokes=3)
    for case in ("xnnpack", "dnnfusion-all", "dnnfusion-profitable"):
        first, second = row[case], again[case]
        assert first["insns"] > 1e6 and first["mems"] > 1e5, (case, first)
        for what in ("insns", "mems", "cycles"):
            assert abs(first[what] - second[what]) <= 0.005 * first[what], (case, what, first, second)
        # Cycles on the big core's model: more than a quarter cycle an instruction (its decode width),
        # and nearly every instruction in a block the model reads.
        assert first["insns"] / 4 <= first["cycles"] <= 4 * first["insns"], (case, first)
        assert first["unmodelled"] <= 0.01 * first["insns"], (case, first)
    # Our delegate runs every planned block: its count is not XNNPACK's in disguise.
    assert row["dnnfusion-all"]["claimed_nodes"] == 18
    assert row["dnnfusion-all"]["insns"] != row["xnnpack"]["insns"]
    table = arm_count.format_models([row])
    assert "| unet_tiny | cortex-a76 |" in table and "| - |" not in table.split("\n")[2]


def test_one_case_counted_alone_matches_the_same_case_among_others(arm64_root, tmp_path):
    # Marks bracket each case's invokes, so what ran before (another interpreter, a delegate)
    # does not leak into a case's figure.
    model = MODELS / "unet_tiny.tflite"
    alone = arm_count.count([arm_count.Case("x", model)], invokes=2)["x"]
    among = arm_count.count([arm_count.Case("y", MODELS / "fc_softmax.tflite"), arm_count.Case("x", model)],
                            invokes=2)["x"]
    assert abs(alone.insns - among.insns) <= 0.005 * alone.insns, (alone, among)


def test_half_precision_counts_xnnpack_with_fp16_forced_against_the_fp16_build(arm64_root, tmp_path):
    # --precision fp16: XNNPACK runs through LiteRT's CompiledModel with FORCE_FP16 (its fp16 kernels,
    # fewer instructions than its fp32 ones on a CNN: the flag reached it), ours is built for
    # arm64-linux-fp16 and claims every planned node.
    model = MODELS / "unet_tiny.tflite"
    fp32 = arm_count.count([arm_count.xnnpack_case("x", model, "fp32")], invokes=1)["x"]
    row = arm_count.model_counts(model, "cortex-a76", tmp_path, invokes=1, cycles=False, precision="fp16")
    assert row["xnnpack"]["insns"] < 0.9 * fp32.insns, (row["xnnpack"], fp32)
    assert row["dnnfusion-all"]["claimed_nodes"] == 18
    assert "| unet_tiny | cortex-a76 | fp16 |" in arm_count.format_models([row])


def test_a_signature_is_counted_per_invoke_of_that_signature(arm64_root, tmp_path):
    # --signature: a decoder's prefill of eight tokens and its decode of one, each its own
    # subgraph; the claims counted are that signature's (every node of it under claim:all).
    import tflite_tools

    model = MODELS / "tiny_gemma_decoder.tflite"
    rows = {name: arm_count.model_counts(model, "cortex-a76", tmp_path / name, invokes=1, cycles=False,
                                         signature=name) for name in ("decode", "prefill_8")}
    for name, row in rows.items():
        fused = tflite_tools.load(tmp_path / name / "out" / "model.fused.tflite")  # as rewritten
        nodes = {s.key: len(fused.subgraphs[s.subgraph_index].operators) for s in fused.signatures}
        assert row["dnnfusion-all"]["claimed_nodes"] == nodes[name], (name, nodes)
    for case in ("xnnpack", "dnnfusion-all"):
        assert rows["prefill_8"][case]["insns"] > rows["decode"][case]["insns"] > 0, case  # 8 tokens, and 1
    assert "| tiny_gemma_decoder decode | cortex-a76 |" in arm_count.format_models([rows["decode"]])
