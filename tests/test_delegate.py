"""The delegate end to end: `fuse` writes a fused model and a delegate library; LiteRT loads the
library and its outputs match LiteRT's reference kernels (tflite_tools.run's tolerance), claiming
exactly the blocks that have kernels, declining what does not match, and never failing the host."""

from __future__ import annotations

import gc
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import tflite_tools
from conftest import MODELS, NOT_RUNNABLE, REPO, corpus_model_paths, model_id, project_model_paths
from delegate_checks import mobilenet_logits, planned_nodes
from halide_gen.profile import schedule_sources
from tflite_tools import cli, runtime
from tflite_tools.fuse import FuseResult, fuse
from tflite_tools.model.fingerprint import METADATA_NAME
from tflite_tools.model.reader import load
from tflite_tools.run import compare, quantized_outputs, read_claims, reference_resolver, run

RUNNABLE = [p for p in project_model_paths() if p.stem not in NOT_RUNNABLE]


def delegate(result: FuseResult, tmp_path: Path, **options: str):
    """The library loaded with a report file; returns (delegate, report path)."""
    report = tmp_path / f"claims-{len(list(tmp_path.glob('claims-*')))}.jsonl"
    return runtime.load_delegate(str(result.library), options={"report": str(report), **options}), report


def reference_outputs(model: Path, inputs):
    resolver = reference_resolver(model)
    return runtime.run(runtime.make_interpreter(model, resolver), inputs)


def assert_close(outputs, reference, quantized=()):
    errors = compare(outputs, reference, [str(i) for i in range(len(outputs))], quantized=quantized)
    assert all(e.ok for e in errors), errors


@pytest.mark.parametrize("path", RUNNABLE, ids=model_id)
def test_every_test_model_matches_litert(path, fused, tmp_path):
    result = fused(path.stem)
    assert result.model.exists() and result.library.exists()
    assert json.loads(result.plan_json.read_text())["library"] == result.library.name
    assert "| block |" in result.report_md.read_text()
    d, report = delegate(result, tmp_path, claim="all")
    interp = runtime.make_interpreter(result.model, "xnnpack", delegates=[d])
    inputs = runtime.random_inputs(interp, seed=1)
    # Int8 outputs within 1 LSB: the host requantizes int8 sums in float32 as XNNPACK does.
    assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs), quantized_outputs(interp))
    claims = read_claims(report)
    assert claims["graph_matches"]
    assert claims["claimed_nodes"] == planned_nodes(result)  # exactly the planned blocks with kernels
    assert claims["declined"] == []


@pytest.mark.parametrize("path", project_model_paths(), ids=model_id)
def test_the_fused_model_is_no_larger_than_the_original(path, fused, tmp_path):
    # App size is the first thing a mobile team checks. Weights keep their stored precision and
    # format (tests/test_stored_weights.py), so the fused model is at most the original plus 1 %
    # and the fingerprint's metadata entry (which alone is more than 1 % of the smallest models).
    result = fused(path.stem)
    model = tflite_tools.load(result.model)
    model.metadata = [(k, v) for k, v in model.metadata if k != METADATA_NAME]
    tflite_tools.save(model, tmp_path / "without_fingerprint.tflite")
    bare = (tmp_path / "without_fingerprint.tflite").stat().st_size
    assert bare <= path.stat().st_size * 1.01
    assert result.sizes == {"original_model": path.stat().st_size, "fused_model": result.model.stat().st_size,
                            "library": result.library.stat().st_size}
    assert result.sizes["fused_model"] - bare <= 160, "the fingerprint entry (64 hex digits) should be small"


@pytest.mark.parametrize("path", RUNNABLE + corpus_model_paths(), ids=model_id)
@pytest.mark.parametrize("claim", ["none", "default", "all"])
def test_never_worse(path, claim, fused, tmp_path):
    # What stock LiteRT + XNNPACK runs (dynamic dimensions, tensors sized only as the model runs,
    # tensors of no elements, several subgraphs and custom ops included), the fused model with the
    # delegate loaded runs and matches, claiming nothing, under its default policy and claiming all
    # it can; quantized outputs within a step, or no further off than stock LiteRT
    # (tflite_tools.run.never_worse). With DNNFUSION_CORPUS set, over the converter corpus too.
    result = fused(path)
    outcome = run(result.model, delegate=result.library, options={} if claim == "default" else {"claim": claim},
                  seed=2)
    assert outcome.ok, outcome.errors
    assert set(outcome.claims["claimed_nodes"]) <= set(planned_nodes(result))


def test_cnn_logits_match_litert(kernel_cache, tmp_path):
    result = fuse(mobilenet_logits(tmp_path), tmp_path / "out", cache_dir=kernel_cache)
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.claims["claimed_nodes"] == planned_nodes(result) and len(planned_nodes(result)) == 64
    assert outcome.ok and 0 < outcome.errors[0].max_rel < 1e-5, outcome.errors


def test_dynamic_range_cnn_logits_match_litert(kernel_cache, tmp_path):
    # Every CONV_2D and DEPTHWISE_CONV_2D with int8 weights quantizes its input image as TFLite does,
    # to the bit: the logits agree to float rounding, far inside the dynamic-range rule.
    result = fuse(mobilenet_logits(tmp_path, "mobilenet_v2_035_96_dynamic_range"), tmp_path / "out",
                  cache_dir=kernel_cache)
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.claims["claimed_nodes"] == planned_nodes(result) == list(range(len(load(result.model).main.operators)))
    assert outcome.ok and 0 < outcome.errors[0].max_rel < 1e-4, outcome.errors


def test_fused_model_runs_on_stock_litert(fused):
    result = fused("mobilenet_v2_035_96")
    interp = runtime.make_interpreter(result.model, "xnnpack")
    inputs = runtime.random_inputs(interp)
    original = runtime.make_interpreter(Path(__file__).parent / "models" / "mobilenet_v2_035_96.tflite", "xnnpack")
    assert_close(runtime.run(interp, inputs), runtime.run(original, inputs))


def test_default_claim_is_the_profitable_blocks(fused, tmp_path):
    result = fused("transformer_encoder")
    d, report = delegate(result, tmp_path)
    runtime.make_interpreter(result.model, delegates=[d])
    profitable = sorted(n for k in result.kernels if k.profitable for n in k.nodes)
    assert read_claims(report)["claimed_nodes"] == profitable


def test_int8_blocks_rounded_as_xnnpack_are_claimed_by_default_on_x86(fused, tmp_path):
    # x86 requantizes int8 sums in float32 as XNNPACK does by default: its kernels then beat XNNPACK's
    # (bench/RESULTS.md), so they are claimed without --measure, and the model's outputs stay close.
    result = fused("mobilenet_v2_035_96_int8")
    assert all(k.kernel and k.profitable for k in result.kernels)
    d, report = delegate(result, tmp_path)
    runtime.make_interpreter(result.model, delegates=[d])
    assert read_claims(report)["claimed_nodes"] == planned_nodes(result)
    outcome = run(result.model, delegate=result.library)
    assert outcome.ok


def test_int8_blocks_rounded_as_the_reference_are_claimed_only_when_asked(tmp_path, kernel_cache):
    # With the reference kernels' fixed-point rounding (bit for bit, but slower than XNNPACK's on
    # x86), unmeasured int8 kernels are not claimed by default.
    model = Path(__file__).parent / "models" / "int8_add.tflite"
    result = fuse(model, tmp_path / "out", target="host-int8-reference", cache_dir=kernel_cache)
    assert result.kernels and all(k.kernel and not k.profitable for k in result.kernels)
    d, report = delegate(result, tmp_path)
    runtime.make_interpreter(result.model, delegates=[d])
    assert read_claims(report)["claimed_nodes"] == []
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.ok and outcome.claims["claimed_nodes"] == planned_nodes(result)


@pytest.mark.cross
@pytest.mark.parametrize("target, claimed", [("arm64-linux", True), ("arm64-linux-nodot", False)])
def test_int8_blocks_are_claimed_by_default_on_arm_with_dot_product(target, claimed, tmp_path, kernel_cache,
                                                                   cross_tools):
    # ARMv8.2's SDOT kernels beat XNNPACK's QS8 path (bench/arm_count.py); ARMv8.0's do not yet.
    result = fuse(Path(__file__).parent / "models" / "int8_add.tflite", tmp_path / "out", target=target,
                  cache_dir=kernel_cache)
    assert result.kernels and all(k.kernel and k.profitable == claimed for k in result.kernels)


def test_only_int8_activations_make_a_block_int8():
    # A float model whose int8 weights are dequantized in the graph keeps its default claim.
    from tflite_tools.model.builder import ModelBuilder, quantization
    from halide_gen.targets import computes_on_int8

    b = ModelBuilder()
    wq = b.const("wq", np.ones((4, 3), np.int8), quant=quantization(0.1, 0))
    d = b.op("DEQUANTIZE", [wq], [4, 3], dtype="float32")
    b.output(b.op("MUL", [b.input("x", [4, 3]), d], [4, 3]))
    assert not computes_on_int8(b.build().main.operators)
    assert computes_on_int8(tflite_tools.load(Path(__file__).parent / "models" / "int8_add.tflite").main.operators)



def test_a_large_table_a_gather_reads_in_part_is_not_made_resident_by_the_claim(tmp_path, private_cache):
    # At claim the delegate checks that every float constant of a block is finite (a kernel's
    # arithmetic may part from TFLite's on inf or NaN). Read plainly, the check made all of an
    # embedding table resident where TFLite's GATHER reads only the rows it is given (bert_small's
    # 31 MB table: the delegate's peak 62 MiB against XNNPACK's 36). Read a chunk at a time, each
    # chunk's pages dropped from the model's file mapping once read, the peak with the delegate
    # stays within its own library's few MiB of XNNPACK's, whether it claims the block or not.
    from tflite_tools.bench import Timings, measure_peak_memory
    from tflite_tools.model.builder import ModelBuilder

    rows, width = 8192, 512  # 16 MiB
    b = ModelBuilder()
    table = b.const("table", np.random.default_rng(0).standard_normal((rows, width)).astype(np.float32))
    ids = b.input("ids", [1, 8], "int32")
    rows_read = b.op("GATHER", [table, ids], [1, 8, width], axis=0)
    b.output(b.op("ADD", [rows_read, b.const("bias", np.ones(width, np.float32))], [1, 8, width]))
    tflite_tools.save(b.build(), tmp_path / "embedding.tflite")
    result = fuse(tmp_path / "embedding.tflite", tmp_path / "out", cache_dir=private_cache)
    assert result.claimable_nodes == 2
    timings = [Timings(name, 0.0, 0.0) for name in ("xnnpack", "dnnfusion-all")]
    measure_peak_memory(timings, str(result.model), str(result.library), threads=1)
    xnnpack, ours = (t.peak_memory_kib / 1024 for t in timings)
    assert ours < xnnpack + 6, (ours, xnnpack)  # MiB; the table alone is 16
    # Read so, the check still finds an infinity in the table's last chunk, and the block stays with TFLite.
    model = tflite_tools.load(tmp_path / "embedding.tflite")
    table = next(t for t in model.main.tensors if t.name == "table")
    values = table.data.copy()
    values[-1, -1] = np.inf
    table.data = values
    tflite_tools.save(model, tmp_path / "embedding.tflite")
    result = fuse(tmp_path / "embedding.tflite", tmp_path / "out", cache_dir=private_cache)
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.claims["claimed_nodes"] == []
    assert "'table' holds NaN or infinity" in outcome.claims["declined"][0]["reason"]

def test_weights_the_delegate_packs_are_resident_once(tmp_path, kernel_cache):
    # Kernels read packed copies of their weights (as XNNPACK's do). The copies' sources, pages of
    # the model's file mapping read once to pack them, are handed back after packing; kept, every
    # packed weight was resident twice, and the delegate's peak no lower than XNNPACK's. (While a
    # weight is packed both are resident: the peak holds the largest weight twice.)
    from tflite_tools.bench import Timings, measure_peak_memory
    from tflite_tools.model.builder import ModelBuilder

    width, layers = 1024, 4  # 4 MiB of weights a layer
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    y = b.input("x", [1, width])
    for k in range(layers):
        y = b.op("FULLY_CONNECTED", [y, b.const(f"w{k}", rng.standard_normal((width, width)).astype(np.float32)),
                                     b.const(f"b{k}", rng.standard_normal(width).astype(np.float32))], [1, width],
                 fused_activation_function="RELU")
    b.output(y)
    tflite_tools.save(b.build(), tmp_path / "fc.tflite")
    result = fuse(tmp_path / "fc.tflite", tmp_path / "out", cache_dir=kernel_cache)
    timings = [Timings(name, 0.0, 0.0) for name in ("xnnpack", "dnnfusion-all")]
    measure_peak_memory(timings, str(result.model), str(result.library), threads=1)
    xnnpack, ours = (t.peak_memory_kib / 1024 for t in timings)
    assert ours < xnnpack - 8, (ours, xnnpack)  # MiB: the weights are 16, the largest 4
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.ok and outcome.claims["claimed_nodes"] == list(range(layers))


FAULTS_PER_INVOKES = """
import resource
from tflite_tools.bench import Contender, Inputs
interp = Contender("dnnfusion", "{model}", delegate="{library}", claim="all").interpreter({threads})
Inputs().set(interp)
for _ in range(3):
    interp.invoke()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    interp.invoke()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_an_invoke_after_the_first_faults_in_no_memory(tmp_path, kernel_cache, threads):
    # What a kernel allocates itself (stages stored whole: here the keys stored transposed, 256 KiB)
    # came from malloc, which hands blocks that large back to the system when freed: every invoke then
    # faulted its pages in anew, and at two threads the faults serialized on the process's page-table
    # lock (an attention block ran no faster than at one). The delegate keeps freed blocks for the next
    # invoke (delegate/src/kernel_heap.cc).
    import subprocess

    from tflite_tools.model.builder import ModelBuilder

    heads, tokens, depth = 4, 256, 64
    b = ModelBuilder()
    perm = b.const("perm", np.int32([0, 2, 1, 3]))
    q, k, v = (b.op("TRANSPOSE", [b.op("RESHAPE", [b.input(name, [1, tokens, heads * depth])], [1, tokens, heads, depth],
                                       new_shape=[1, tokens, heads, depth]), perm], [1, heads, tokens, depth])
               for name in "qkv")
    scores = b.op("BATCH_MATMUL", [q, k], [1, heads, tokens, tokens], adj_y=True)
    weights = b.op("SOFTMAX", [scores], scores.shape, beta=0.125)
    out = b.op("TRANSPOSE", [b.op("BATCH_MATMUL", [weights, v], [1, heads, tokens, depth]), perm], [1, tokens, heads, depth])
    b.output(b.op("RESHAPE", [out], [1, tokens, heads * depth], new_shape=[1, tokens, heads * depth]))
    tflite_tools.save(b.build(), tmp_path / "attention.tflite")
    result = fuse(tmp_path / "attention.tflite", tmp_path / "out", cache_dir=kernel_cache)
    d, _ = delegate(result, tmp_path, claim="all", num_threads=str(threads))
    interp = runtime.make_interpreter(result.model, "xnnpack", threads, delegates=[d])
    inputs = runtime.random_inputs(interp)
    assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs))
    # In a fresh process: malloc's thresholds grow with what a process freed before (this one's, by
    # far), and an app's first model meets the fresh ones.
    count = FAULTS_PER_INVOKES.format(model=result.model, library=result.library, threads=threads)
    faults = int(subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, check=True,
                                cwd=REPO).stdout.split()[-1])
    assert faults < 20, f"{faults} pages faulted in over 20 invokes"


def test_the_host_library_lays_out_each_subtargets_code_together(kernel_cache, tmp_path):
    # The host library holds every kernel for five x86 sub-targets, of which the CPU runs one. Linked
    # kernel by kernel, each page of code mixed them and all were resident: the link takes the
    # dispatching wrappers first, then each sub-target's objects of every kernel together.
    import subprocess

    from halide_gen.bundle import grouped_by_subtarget
    from halide_gen.targets import target_spec

    result = fuse(MODELS / "unet_tiny.tflite", tmp_path / "out", target="host", cache_dir=kernel_cache)
    kernels = sorted({k.kernel for k in result.kernels if k.kernel})[:3]
    libraries = [next(p for p in kernel_cache.glob(f"host-*/{k}.a") if re.fullmatch(r"host-[0-9a-f]+", p.parent.name))
                 for k in kernels]
    objects = grouped_by_subtarget("c++", libraries, tmp_path / "objects")
    members = [subprocess.run(["ar", "t", str(lib)], capture_output=True, text=True, check=True).stdout.split()
               for lib in libraries]
    assert sorted(o.name for o in objects) == sorted(m for names in members for m in names)
    n, subtargets = len(libraries), len(target_spec("host").halide)
    assert len(objects) == n * (1 + subtargets)
    assert all(o.name == f"{lib.name}_wrapper.o" for o, lib in zip(objects[:n], libraries))
    for k in range(subtargets):
        group = objects[n * (1 + k):n * (2 + k)]
        suffixes = {o.name[len(lib.name):] for o, lib in zip(group, libraries)}
        assert len(suffixes) == 1 and all(o.name.startswith(lib.name) for o, lib in zip(group, libraries))
    assert all(o.is_file() for o in objects)


def test_unclaimed_nodes_still_go_to_xnnpack(fused, tmp_path):
    result = fused("mobilenet_v2_035_96")
    names = [k.block for k in result.kernels if k.kernel]
    chosen = names[::3]  # every third block: the rest stays with TFLite
    d, report = delegate(result, tmp_path, claim="all", blocks=",".join(chosen))
    interp = runtime.make_interpreter(result.model, "xnnpack", delegates=[d])
    claims = read_claims(report)
    assert claims["claimed_blocks"] == chosen
    mine = set(claims["claimed_nodes"])
    ops = interp._get_ops_details()
    original = [o for o in ops if o["op_name"] != "DELEGATE"]
    delegated = [o for o in ops if o["op_name"] == "DELEGATE"]
    # Outputs of unclaimed nodes that leave them are produced by delegate nodes that are not ours:
    # XNNPACK's. Ours produce only tensors of claimed nodes.
    claimed_outputs = {t for o in original if o["index"] in mine for t in o["outputs"]}
    ours = [o for o in delegated if set(o["outputs"]) <= claimed_outputs]
    xnnpack = [o for o in delegated if o not in ours]
    assert ours and xnnpack
    unclaimed_outputs = {t for o in original if o["index"] not in mine for t in o["outputs"]}
    assert all(set(o["outputs"]) <= unclaimed_outputs for o in xnnpack)
    inputs = runtime.random_inputs(interp)
    assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs))


def test_library_of_another_model_declines_everything(fused, tmp_path, capfd):
    other, model = fused("unet_tiny"), fused("mobilenet_v2_035_96")
    d, report = delegate(other, tmp_path, claim="all")
    interp = runtime.make_interpreter(model.model, "xnnpack", delegates=[d])
    claims = read_claims(report)
    assert claims["claimed_nodes"] == [] and not claims["graph_matches"]
    assert "built for unet_tiny.tflite" in claims["declined"][0]["reason"]
    # Said at the default log level: nothing of the library runs, and the user should know why.
    assert "dnnfusion: warning: declined *: this library was built for unet_tiny.tflite" in capfd.readouterr().err
    inputs = runtime.random_inputs(interp)
    assert_close(runtime.run(interp, inputs), reference_outputs(model.model, inputs))


def test_a_native_build_declines_on_a_cpu_without_its_features(tmp_path, monkeypatch, capfd):
    # host-native kernels are built for the CPU that fused the model; on a CPU without a feature they
    # use they would die of SIGILL. Built here with one feature this CPU lacks, the delegate declines
    # every node with the reason, and TFLite runs the model.
    import dataclasses

    import halide as hl

    from halide_gen import targets

    here, native = hl.get_host_target(), targets.target_spec("host-native")
    lacking = next(f for f in (getattr(hl.TargetFeature, n) for n in ("AVX512_SapphireRapids", "AVX512_Zen4",
                                                                      "AVX10_1", "X86APX"))
                   if not here.has_feature(f))
    build = hl.Target(native.halide[0]).with_feature(lacking).to_string()
    monkeypatch.setattr(targets, "_for_this_cpu", lambda spec: dataclasses.replace(spec, halide=(build,)))
    result = fuse(MODELS / "depthwise_residual.tflite", tmp_path / "out", target="host-native",
                  cache_dir=tmp_path / "cache")
    d, report = delegate(result, tmp_path, claim="all")
    interp = runtime.make_interpreter(result.model, "xnnpack", delegates=[d])
    claims = read_claims(report)
    assert claims["claimed_nodes"] == [] and planned_nodes(result)
    assert "were built for the CPU that fused the model, and this CPU lacks" in claims["declined"][0]["reason"]
    inputs = runtime.random_inputs(interp)
    assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs))


def test_unfused_model_is_declined_for_its_missing_fingerprint(fused, tmp_path, capfd):
    result = fused("swish_chain")
    original = Path(__file__).parent / "models" / "swish_chain.tflite"
    d, report = delegate(result, tmp_path, claim="all")
    runtime.make_interpreter(original, delegates=[d])
    assert "no dnnfusion fingerprint" in read_claims(report)["declined"][0]["reason"]
    assert "no dnnfusion fingerprint" in capfd.readouterr().err  # a warning, at the default log level


def test_recalibrated_int8_model_has_another_fingerprint():
    # int8 kernels compile the scales in: a model converted again with other calibration data has
    # the same structure but must not match the old bundle.
    from tflite_tools.model.fingerprint import subgraph_fingerprint

    model = tflite_tools.load(Path(__file__).parent / "models" / "int8_add.tflite")
    before = subgraph_fingerprint(model.main)
    model.main.outputs[0].quantization.scale = model.main.outputs[0].quantization.scale * np.float32(1.5)
    assert subgraph_fingerprint(model.main) != before


def test_two_interpreters_share_one_delegate(fused, tmp_path):
    result = fused("depthwise_residual")
    d, report = delegate(result, tmp_path, claim="all")
    first = runtime.make_interpreter(result.model, delegates=[d])
    second = runtime.make_interpreter(result.model, delegates=[d])
    a, b = runtime.random_inputs(first, seed=2), runtime.random_inputs(first, seed=3)
    out_a, out_b = runtime.run(first, a), runtime.run(second, b)
    assert_close(runtime.run(first, a), out_a)  # the first is untouched by the second's run
    assert_close(out_a, reference_outputs(result.model, a))
    assert_close(out_b, reference_outputs(result.model, b))
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(lines) == 2 and all(line["claimed_nodes"] == planned_nodes(result) for line in lines)


def test_resized_input_is_declined_and_stays_correct(fused, tmp_path):
    # Resized along its width: neither its batch nor its sequence (those run the kernels on windows:
    # tests/test_windows.py), with no kernel compiled for the shape.
    result = fused("swish_chain")
    d, report = delegate(result, tmp_path, claim="all")
    interp = runtime.make_interpreter(result.model, delegates=[d])
    detail = interp.get_input_details()[0]
    shape = [*detail["shape"][:2], 3, *detail["shape"][3:]]
    interp.resize_tensor_input(detail["index"], shape)
    interp.allocate_tensors()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out = runtime.run(interp, [x])
    ref = runtime.Interpreter(model_path=str(result.model), experimental_op_resolver_type=runtime.RESOLVERS["reference"])
    ref.resize_tensor_input(detail["index"], shape)
    ref.allocate_tensors()
    assert_close(out, runtime.run(ref, [x]))
    last = [json.loads(line) for line in report.read_text().splitlines()][-1]
    assert last["claimed_nodes"] == [] and ",3," in last["declined"][0]["reason"]


@pytest.mark.parametrize("threads", [1, 2])
def test_num_threads(fused, tmp_path, threads):
    result = fused("unet_tiny")
    d, _ = delegate(result, tmp_path, claim="all", num_threads=str(threads))
    interp = runtime.make_interpreter(result.model, "xnnpack", threads, delegates=[d])
    inputs = runtime.random_inputs(interp)
    assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs))


def test_parallel_loops_give_the_one_thread_answer_every_time(fused, tmp_path):
    """The delegate's pool (delegate/src/thread_pool.cc) splits each loop into shares that spinning
    workers take and steal from: at 2 and 4 threads (more than this machine may have cores), every
    invoke must give the one-thread output bit for bit."""
    result = fused("mobilenet_v2_035_96")
    outputs = {}
    for threads in (1, 2, 4):
        d, _ = delegate(result, tmp_path, claim="all", num_threads=str(threads))
        interp = runtime.make_interpreter(result.model, "xnnpack", 1, delegates=[d])
        inputs = runtime.random_inputs(interp)
        outputs[threads] = [runtime.run(interp, inputs) for _ in range(5)]
    expected = outputs[1][0]
    for threads, runs in outputs.items():
        for run_outputs in runs:
            for got, want in zip(run_outputs, expected):
                np.testing.assert_array_equal(got, want, err_msg=f"{threads} threads")


def test_only_the_partition_that_ends_the_invoke_keeps_its_workers_awake(fused, tmp_path, capfd):
    """After the partition holding the model's last node the pool's workers linger (yielding) for the
    next invoke; after any other they sleep at once, leaving the cores to the XNNPACK nodes that run
    next (delegate/src/thread_pool.h). Either way, invoke after invoke, the answer is LiteRT's."""
    result = fused("unet_tiny")
    first, *_, last = [block["name"] for block in json.loads(result.plan_json.read_text())["blocks"]]
    d, _ = delegate(result, tmp_path, blocks=f"{first},{last}", num_threads="2", log_level="verbose")
    interp = runtime.make_interpreter(result.model, "xnnpack", 2, delegates=[d])
    inputs = runtime.random_inputs(interp)
    for _ in range(3):
        assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs))
    del interp, d  # the pool's worker ends with the last delegate, before the next test counts threads
    gc.collect()
    partitions = [line for line in capfd.readouterr().err.splitlines() if "verbose: partition of" in line]
    assert len(partitions) == 2
    assert sum("the pool's workers linger after it" in line for line in partitions) == 1


def _threads_in_process() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_worker_threads_end_with_the_last_delegate(fused, tmp_path):
    """A host that destroys its delegates may unload the library: no worker may outlive them."""
    result = fused("unet_tiny")
    before = _threads_in_process()
    d, _ = delegate(result, tmp_path, claim="all", num_threads="3")
    interp = runtime.make_interpreter(result.model, "xnnpack", 1, delegates=[d])
    runtime.run(interp, runtime.random_inputs(interp))
    assert _threads_in_process() == before + 2  # the invoking thread is the third
    del interp, d
    gc.collect()
    assert _threads_in_process() == before


def test_invoke_leaves_the_callers_floating_point_mode_alone(fused, tmp_path):
    """Kernels run with subnormals as zero (as XNNPACK's do), the caller's thread only meanwhile."""
    result = fused("unet_tiny")
    d, _ = delegate(result, tmp_path, claim="all")
    interp = runtime.make_interpreter(result.model, "xnnpack", 1, delegates=[d])
    runtime.run(interp, runtime.random_inputs(interp))
    tiny = np.array([np.finfo(np.float32).tiny], np.float32)
    assert (tiny * np.float32(0.25))[0] == np.float32(2.0**-128)  # a subnormal, not flushed to 0


@pytest.mark.parametrize("options, message", [
    ({"num_threads": "many"}, "num_threads: expected an integer"),
    ({"claim": "some"}, "claim: expected profitable, all or none"),
    ({"colour": "blue"}, "unknown option 'colour'"),
    ({"blocks": "block_000,no_such_block"}, "blocks: no block 'no_such_block' in this bundle (its blocks: block_000"),
    ({"blocks": ""}, "blocks: expected block names separated by commas, got ''"),
    ({"blocks": ","}, "blocks: expected block names separated by commas, got ','"),
])
def test_bad_options_are_refused_with_a_message(fused, options, message):
    # LiteRT passes the plugin's report_error text on in the exception it raises.
    with pytest.raises(ValueError) as failure:
        runtime.load_delegate(str(fused("add_relu").library), options=options)
    assert "dnnfusion: bad delegate option: " + message in str(failure.value)


def test_claim_none_runs_stock_litert(fused, tmp_path):
    result = fused("fc_softmax")
    d, report = delegate(result, tmp_path, claim="none")
    interp = runtime.make_interpreter(result.model, delegates=[d])
    assert read_claims(report)["claimed_nodes"] == []
    inputs = runtime.random_inputs(interp)
    assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs))


def test_model_without_kernels_still_gets_a_library_that_claims_nothing(fused, tmp_path):
    result = fused("zero_size")  # its one block has a tensor of no elements
    assert not any(k.kernel for k in result.kernels)
    outcome = run(result.model, delegate=result.library)
    assert outcome.ok and outcome.claims["claimed_nodes"] == []


def test_cli_fuse_then_run_compare(tmp_path, capsys, model_path):
    out = tmp_path / "out"
    assert cli.main(["fuse", str(model_path("conv_relu6")), "-o", str(out)]) == 0
    drawn = {"plan.svg"} if shutil.which("dot") else set()  # Graphviz draws the plan where it is installed
    assert {p.name for p in out.iterdir()} == {"model.fused.tflite", "libconv_relu6_dnnfusion.so", "plan.json",
                                               "report.md", ".dnnfusion-out.json", "model_explorer", *drawn}
    capsys.readouterr()
    assert cli.main(["run", str(out / "model.fused.tflite"), "--delegate", str(out / "libconv_relu6_dnnfusion.so"),
                     "--compare", "--option", "claim=all"]) == 0
    text = capsys.readouterr().out
    assert "delegate: claimed 1 blocks" in text and " ok" in text


def test_cli_fuse_emit_asm_keeps_every_kernels_assembly(tmp_path, capsys, model_path, monkeypatch, private_cache):
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(private_cache.parent))
    out = tmp_path / "out"
    assert cli.main(["fuse", str(model_path("swish_chain")), "-o", str(out), "--target", "host", "--emit-asm"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    blocks = [k["block"] for k in plan["kernels"] if k["kernel"]]
    assert sorted(p.name for p in (out / "asm").iterdir()) == sorted(blocks)
    files = list((out / "asm" / blocks[0]).iterdir())
    # one .s and one .stmt per sub-target of the host's multitarget library
    assert len([f for f in files if f.suffix == ".s"]) == len([f for f in files if f.suffix == ".stmt"]) >= 3
    assert all(f.stat().st_size > 0 for f in files)


def test_cli_run_with_npy_inputs(tmp_path, capsys, model_path):
    model = model_path("add_relu")
    interp = runtime.make_interpreter(model)
    paths = []
    for k, array in enumerate(runtime.random_inputs(interp)):
        paths.append(tmp_path / f"in{k}.npy")
        np.save(paths[-1], array)
    assert cli.main(["run", str(model), "--json", "--inputs", *map(str, paths)]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    np.save(paths[0], np.zeros((1, 2, 3), np.float32))
    assert cli.main(["run", str(model), "--inputs", *map(str, paths)]) == 2
    assert "takes" in capsys.readouterr().err


def test_cli_fuse_bad_model_leaves_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    out = tmp_path / "out"
    assert cli.main(["fuse", str(bad), "-o", str(out)]) == 2
    assert not out.exists() or not any(out.iterdir())
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # LiteRT's Delegate.__del__ after a failed load
def test_cli_run_bad_delegate_is_exit_2(tmp_path, capsys, model_path):
    lib = tmp_path / "libnot.so"
    lib.write_bytes(b"not a library")
    assert cli.main(["run", str(model_path("add_relu")), "--delegate", str(lib)]) == 2
    assert "not a delegate library: not an ELF file" in capsys.readouterr().err


def test_blocks_tflite_would_split_are_declined_not_failed(fused, tmp_path):
    # TFLite partitions the claimed nodes itself. Claiming these blocks of the encoder leaves
    # block_005 (the attention core) waiting on nodes TFLite runs in between (the key and value
    # projections, which read block_001's LayerNorm) while its query reshape could run at once: it
    # would land in two partitions, so the delegate declines it up front instead of failing Prepare.
    result = fused("transformer_encoder")
    chosen = ["block_000", "block_001", "block_002", "block_005"]
    d, report = delegate(result, tmp_path, claim="all", blocks=",".join(chosen))
    interp = runtime.make_interpreter(result.model, delegates=[d])
    claims = read_claims(report)
    assert claims["claimed_blocks"] == ["block_000", "block_001", "block_002"]
    (declined,) = claims["declined"]
    assert declined["block"] == "block_005"
    # The reason names the unclaimed nodes the block waits on.
    assert declined["reason"].startswith("TFLite would split it across delegate partitions: it waits on node ")
    named = [int(n) for n in re.findall(r"node (\d+) \(", declined["reason"])]
    block = next(k for k in result.kernels if k.block == "block_005")
    assert named and all(n not in claims["claimed_nodes"] and n not in block.nodes for n in named)
    inputs = runtime.random_inputs(interp)
    assert_close(runtime.run(interp, inputs), reference_outputs(result.model, inputs))


def test_autoschedulers_pick_a_source_per_block_and_stay_correct(tmp_path, private_cache):
    # Every block is timed under the templates and Halide's CPU autoschedulers; the fastest is
    # compiled into the bundle (and the choice cached by block signature).
    model = Path(__file__).parent / "models" / "fc_softmax.tflite"
    result = fuse(model, tmp_path / "out", cache_dir=private_cache, autoschedulers=True, measure=True)
    with_kernel = [k for k in result.kernels if k.kernel]
    assert with_kernel and all(k.schedule in schedule_sources("host") for k in with_kernel)
    assert all(k.ratio is not None and k.ratio > 0 for k in with_kernel)
    cached = json.loads((private_cache / "block-timings.json").read_text())
    assert any(key.startswith("schedule:") for key in cached) and any(key.startswith("ratio:") for key in cached)
    plan = json.loads(result.plan_json.read_text())
    assert [k["schedule"] for k in plan["kernels"] if k["kernel"]] == [k.schedule for k in with_kernel]
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.ok and outcome.claims["claimed_nodes"] == planned_nodes(result)


def test_profile_option_times_every_block_in_context(fused, tmp_path):
    result = fused("transformer_encoder")
    profile = tmp_path / "profile.jsonl"
    d, _ = delegate(result, tmp_path, claim="all", profile=str(profile))
    interp = runtime.make_interpreter(result.model, delegates=[d])
    inputs = runtime.random_inputs(interp)
    for _ in range(3):
        runtime.run(interp, inputs)
    del interp  # the partition writes its profile when TFLite frees it
    import gc

    gc.collect()
    rows = [json.loads(line) for line in profile.read_text().splitlines()]
    assert sorted(r["block"] for r in rows) == sorted(k.block for k in result.kernels if k.kernel)
    assert all(r["calls"] == 3 and r["total_us"] > 0 and r["mean_us"] == pytest.approx(r["total_us"] / 3, rel=1e-2, abs=1e-3)
               for r in rows)


@pytest.mark.parametrize("stem", ["unet_tiny", "conv_relu6", "add_relu", "depthwise_residual", "fc_softmax",
                                  "swish_chain", "mobilenet_v2_035_96"])
def test_nan_and_inf_inputs_come_out_as_from_litert(fused, tmp_path, stem):
    # A NaN in a conv's window spreads through the model; TFLite's reference kernels decide where.
    result = fused(stem)
    d, _ = delegate(result, tmp_path, claim="all")
    interp = runtime.make_interpreter(result.model, delegates=[d])
    rng = np.random.default_rng(5)
    inputs = []
    for x in runtime.random_inputs(interp):
        flat = x.reshape(-1)
        for value in (np.nan, np.inf, -np.inf, 3e38):
            flat[rng.integers(0, flat.size)] = value
        inputs.append(x)
    outputs, reference = runtime.run(interp, inputs), reference_outputs(result.model, inputs)
    errors = compare(outputs, reference, [str(i) for i in range(len(outputs))])
    assert all(e.ok for e in errors), errors
    assert any(np.isnan(r).any() for r in reference)  # the check is not vacuous


@pytest.mark.parametrize("where", ["a missing folder", "a full disk", "a FIFO nobody reads"])
@pytest.mark.parametrize("option", ["profile", "report"])
def test_unwritable_profile_or_report_warns_alike(fused, tmp_path, capfd, option, where):
    # Never blocks the host (a FIFO without a reader), never fails silently (/dev/full: every write
    # is ENOSPC), and says so once per delegate, however many partitions and interpreters write.
    import gc
    import os

    path = {"a missing folder": tmp_path / "missing" / "x.jsonl", "a full disk": Path("/dev/full"),
            "a FIFO nobody reads": tmp_path / "fifo"}[where]
    if where == "a FIFO nobody reads":
        os.mkfifo(path)
    result = fused("add_relu")
    d = runtime.load_delegate(str(result.library), options={option: str(path), "claim": "all"})
    for _ in range(2):
        interp = runtime.make_interpreter(result.model, delegates=[d])
        runtime.run(interp, runtime.random_inputs(interp))
        del interp
        gc.collect()
    assert capfd.readouterr().err.count(f"dnnfusion: warning: cannot write the {option} to {path}") == 1


def _delegate_library_variants(library: Path, tmp_path: Path) -> dict[str, Path]:
    data = library.read_bytes()
    (tmp_path / "truncated.so").write_bytes(data[:len(data) // 3])
    (tmp_path / "header-only.so").write_bytes(data[:64])
    (tmp_path / "text.so").write_text("not a library")
    import ctypes.util

    libm = Path("/lib/x86_64-linux-gnu/libm.so.6")
    return {"truncated": tmp_path / "truncated.so", "header only": tmp_path / "header-only.so",
            "text": tmp_path / "text.so", "another library": libm if libm.exists() else Path(ctypes.util.find_library("m"))}


@pytest.mark.parametrize("variant, message", [
    ("truncated", "truncated"), ("header only", "not a delegate library"), ("text", "not an ELF file"),
    ("another library", "does not export tflite_plugin_create_delegate"),
])
def test_run_refuses_what_is_not_a_delegate_library_before_loading_it(fused, tmp_path, capsys, variant, message):
    result = fused("add_relu")
    library = _delegate_library_variants(result.library, tmp_path)[variant]
    assert cli.main(["run", str(result.model), "--delegate", str(library)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a delegate library" in err and message in err


def test_blocked_weights_are_packed_by_the_runtime_as_by_python(kernel_cache, tmp_path):
    # Convs and FCs take tile-blocked weights (pack.py "o_blocked"); the delegate
    # packs them itself at Prepare (delegate/src/pack.cc), so this checks the two packers agree.
    from tflite_tools.model.builder import ModelBuilder

    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input("x", [1, 3, 3, 5])
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((40, 3, 3, 5)).astype(np.float32)),
                         b.const("b", rng.standard_normal(40).astype(np.float32))], [1, 1, 1, 40], padding="VALID",
             stride_h=1, stride_w=1, fused_activation_function="RELU")
    z = b.op("FULLY_CONNECTED", [b.op("RESHAPE", [y, b.const("s", np.array([1, 40], np.int32))], [1, 40]),
                                 b.const("w2", rng.standard_normal((37, 40)).astype(np.float32)),
                                 b.const("b2", rng.standard_normal(37).astype(np.float32))], [1, 37])
    b.output(z)
    tflite_tools.save(b.build(), tmp_path / "mv.tflite")
    result = fuse(tmp_path / "mv.tflite", tmp_path / "out", cache_dir=kernel_cache)
    plan = json.loads(result.plan_json.read_text())
    assert plan["kernels"] and all(k["kernel"] for k in plan["kernels"])
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.ok and outcome.errors[0].max_rel < 1e-5, outcome.errors
    assert outcome.claims["claimed_nodes"] == planned_nodes(result)


def test_measured_fuse_makes_the_fastest_policy_the_default(tmp_path, private_cache):
    # fuse --measure times the whole model with XNNPACK alone and with each claim policy; the
    # fastest is the delegate's default when its options name no policy. Which one wins is a
    # measurement, so the test checks the plumbing, not the winner.
    model = Path(__file__).parent / "models" / "swish_chain.tflite"
    result = fuse(model, tmp_path / "out", cache_dir=private_cache, measure=True)
    for claim, medians in ((result.default_claim, result.whole_model_ms),
                           (result.default_claim_threaded, result.whole_model_ms_threaded)):
        assert claim in ("profitable", "all", "none")
        assert set(medians) == {"profitable", "all", "none"}
        assert medians[claim] == min(medians.values())
    plan = json.loads(result.plan_json.read_text())
    assert (plan["default_claim"], plan["default_claim_threaded"]) == (result.default_claim,
                                                                     result.default_claim_threaded)
    assert (f"Default claim policy: `{result.default_claim}` at one thread, `{result.default_claim_threaded}` at more"
            in result.report_md.read_text())
    outcome = run(result.model, delegate=result.library)
    assert outcome.ok and outcome.claims["claim"] == result.default_claim
    assert run(result.model, delegate=result.library, threads=2).claims["claim"] == result.default_claim_threaded
    assert run(result.model, delegate=result.library, options={"claim": "all"}).claims["claim"] == "all"


def test_the_default_policy_follows_the_interpreters_thread_count(tmp_path, monkeypatch, private_cache):
    # The bundle holds a default policy for one thread and one for more (claiming only the blocks
    # faster at one thread lost at two: MobileNetV3-Small 1.25x XNNPACK against 0.87x claiming all).
    # The measurements are replaced by fixed answers so that the two differ.
    import tflite_tools.fuse as fuse_module

    answers = {1: "all", fuse_module.MEASURED_THREADS: "none"}
    monkeypatch.setattr(fuse_module, "best_default_claim",
                        lambda model, library, threads: (answers[threads], {"all": 1.0, "profitable": 1.0, "none": 1.0}))
    model = Path(__file__).parent / "models" / "swish_chain.tflite"
    result = fuse(model, tmp_path / "out", cache_dir=private_cache, measure=True)
    assert (result.default_claim, result.default_claim_threaded) == ("all", "none")
    for threads, option, claim in ((1, {}, "all"), (2, {}, "none"), (4, {}, "none"), (1, {"num_threads": "2"}, "none"),
                                   (2, {"claim": "all"}, "all")):
        outcome = run(result.model, delegate=result.library, threads=threads, options=option)
        assert outcome.ok and outcome.claims["claim"] == claim, (threads, option, outcome.claims)
        assert bool(outcome.claims["claimed_nodes"]) == (claim == "all")


def test_bench_ab_times_fused_outputs_side_by_side(fused, capsys):
    # bench/ab.py: the before / after measurement every speed change is recorded with.
    sys.path.insert(0, str(REPO / "bench"))
    import ab  # bench/ is not a package

    out = fused("add_relu").out
    assert ab.main([f"before={out}", f"after={out}", "--runs", "2", "--warmup", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["xnnpack", "before", "after"]
    assert lines[0].endswith("1.000x")
