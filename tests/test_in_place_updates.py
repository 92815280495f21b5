"""A KV cache updated in place. Where a caller passes a cache in and out as one buffer (TFLite's
custom allocations: what on-device LLM runtimes do), TFLite's DYNAMIC_UPDATE_SLICE writes only the
update; a block's in-place form (halide_gen.block.build_block) does the same. Checked here against
LiteRT's reference kernels, on one buffer shared as TFLite shares it, at positions in range and
clamped; and on a buffer of its own, that it writes nothing but the update. The delegate's choice
of form per invoke is checked under the fake host (delegate/tests/fake_host_test.cc)."""

from __future__ import annotations

import numpy as np
import pytest

import tflite_tools
from fusion.ecg import build_ecg
from fusion.plan import plan_fusion
from fusion.rewrite import rewrite
from halide_gen.block import build_block
from halide_gen.jit import JitKernel, argument_arrays
from halide_gen.schedule import schedule_cpu
from halide_gen.schedule.params import NEON, X86
from opcheck import FLOAT_RTOL
from tflite_tools import runtime
from tflite_tools.model.builder import ModelBuilder
from tflite_tools.run import reference_resolver

from conftest import MODELS


def _weights(*shape):
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def _cache_update():
    """A [1, 8, 2, 4] cache and one token's [1, 1, 2, 4] at a run-time position."""
    b = ModelBuilder()
    cache, token = b.input("cache", [1, 8, 2, 4]), b.input("token", [1, 1, 2, 4])
    start = b.input("start", [4], "int32")
    b.output(b.op("DYNAMIC_UPDATE_SLICE", [cache, token, start], [1, 8, 2, 4]))
    return b.build(), lambda rng, p: [rng.standard_normal((1, 8, 2, 4)).astype(np.float32),
                                      rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
                                      np.array([0, p, 1, -2], np.int32)]


def _projected_update():
    """The new token's projection feeds the update; the updated cache, read whole, feeds the
    query's scores in the same block (an attention's first product)."""
    b = ModelBuilder()
    cache, x = b.input("cache", [1, 6, 5]), b.input("x", [1, 1, 3])
    query, start = b.input("query", [1, 2, 5]), b.input("start", [3], "int32")
    key = b.op("FULLY_CONNECTED", [x, b.const("w", _weights(5, 3)), None], [1, 1, 5], keepNumDims=True)
    keys = b.op("DYNAMIC_UPDATE_SLICE", [cache, b.op("TANH", [key], [1, 1, 5]), start], [1, 6, 5])
    b.output(keys, b.op("BATCH_MATMUL", [query, keys], [1, 2, 6], adj_x=False, adj_y=True))
    return b.build(), lambda rng, p: [rng.standard_normal((1, 6, 5)).astype(np.float32),
                                      rng.standard_normal((1, 1, 3)).astype(np.float32),
                                      rng.standard_normal((1, 2, 5)).astype(np.float32),
                                      np.array([0, p, 0], np.int32)]


def _decoder_step():
    """One attention layer's decode step with an external KV cache (tests/models): the key and value
    caches updated at the position, then read whole by the attention in the same block."""
    model = tflite_tools.load(MODELS / "kv_cache_decoder.tflite")
    rewrite(model)
    model = tflite_tools.parse(tflite_tools.serialize(model))
    interp = runtime.make_interpreter(tflite_tools.serialize(model))
    names = [d["name"] for d in interp.get_input_details()]

    def inputs(rng, p):
        arrays = runtime.random_inputs(interp, int(rng.integers(1 << 30)))
        return [np.array([p], np.int32) if "pos" in name else a for name, a in zip(names, arrays)]

    return model, inputs


CASES = {"cache_update": (_cache_update, (0, 3, 7, 8, 100, -1, -50)),
         "projected_update": (_projected_update, (2, 9)),
         "decoder_step": (_decoder_step, (0, 5, 15, 40, -3))}


def _blocks_with_updates(model, inputs):
    """(block ops, outputs, every tensor's reference value) for each planned block of the main
    subgraph holding a DYNAMIC_UPDATE_SLICE, after running LiteRT's reference kernels on `inputs`."""
    data = tflite_tools.serialize(model)
    sg = model.main
    index = {id(t): k for k, t in enumerate(sg.tensors)}
    interp = runtime.make_interpreter(data, resolver=reference_resolver(model), preserve_all_tensors=True)
    runtime.run(interp, inputs)
    plan = plan_fusion(build_ecg(sg))
    for block in plan.blocks:
        ops = [plan.ecg.nodes[i].op for i in block.ops]
        if any(op.name == "DYNAMIC_UPDATE_SLICE" for op in ops):
            yield ops, block.outputs, lambda t: interp.get_tensor(index[id(t)])


def _check(ref: np.ndarray, got: np.ndarray, what: str) -> None:
    scale = max(float(np.abs(ref).max()), 1e-30)
    err = float(np.abs(ref.astype(np.float64) - got).max()) / scale
    assert err <= FLOAT_RTOL, f"{what}: relative error {err:.3g}"


@pytest.mark.parametrize("params", [X86, NEON], ids=["x86", "neon"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_cache_shared_in_and_out_is_updated_in_place_as_litert_updates_it(case, params):
    make, positions = CASES[case]
    model, make_inputs = make()
    rng = np.random.default_rng(0)
    checked = 0
    for position in positions:
        inputs = make_inputs(rng, position)
        for ops, outputs, reference in _blocks_with_updates(model, inputs):
            plain = build_block("plain", ops, outputs)
            assert plain.updates_in_place, "a cache update of a block input was not found updatable in place"
            for in_place in (False, True):  # the plain form is correct on a shared buffer too, only slower
                kernel = build_block("in_place" if in_place else "plain", ops, outputs, in_place=in_place)
                assert kernel.updates_in_place == plain.updates_in_place
                jit = JitKernel(kernel, schedule=lambda k: schedule_cpu(k, params))
                arrays = argument_arrays(kernel, {id(a.tensor): reference(a.tensor) for a in kernel.arguments
                                                  if not a.tensor.is_constant})
                jit.bind(arrays, shared=kernel.updates_in_place)
                jit.run()
                for (t, _), got in zip(kernel.outputs, jit.results()):
                    _check(reference(t), got, f"{case} at {position}, {kernel.name}: {t.name}")
            # On an output buffer of its own, the in-place form writes the update and nothing else.
            jit.bind(arrays, fill=np.nan)
            jit.run()
            results = jit.results()
            for _, out in plain.updates_in_place:
                t = outputs[out]
                update = next(op.inputs[1] for op in ops if op.outputs[0] is t)
                written = ~np.isnan(results[out])
                assert written.sum() == int(np.prod(update.shape)), f"{case} at {position}: {t.name}"
                _check(reference(t)[written], results[out][written], f"{case} at {position}: {t.name}'s update")
            checked += 1
    assert checked >= len(positions)


def test_a_cache_read_by_another_op_of_its_block_is_not_updated_in_place():
    # The in-place form changes the operand's memory while the kernel runs: an op of the block that
    # reads the cache itself (not its update) would see the update, or not, by schedule.
    b = ModelBuilder()
    cache, token = b.input("cache", [1, 6, 4]), b.input("token", [1, 1, 4])
    start = b.input("start", [3], "int32")
    b.output(b.op("DYNAMIC_UPDATE_SLICE", [cache, token, start], [1, 6, 4]), b.op("NEG", [cache], [1, 6, 4]))
    sg = b.build().main
    assert build_block("b", sg.operators, sg.outputs).updates_in_place == []


def test_the_bench_times_each_cache_updating_block_in_both_forms(tmp_path):
    # bench/cache_updates.py: a row per block identity that updates a cache, and their total.
    import subprocess
    import sys

    from conftest import REPO

    out = subprocess.run([sys.executable, str(REPO / "bench" / "cache_updates.py"), str(MODELS / "kv_cache_decoder.tflite"),
                          "--rounds", "1"], capture_output=True, text=True, check=True, timeout=600).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]  # after the header
    assert len(rows) >= 2 and rows[-1].startswith("| total |"), out
    assert "DYNAMIC_UPDATE_SLICE" in rows[0], out
