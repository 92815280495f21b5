"""Checking a model's fused blocks against LiteRT, one block at a time (JIT), and the whole fused
model through the delegate: shared by tests/test_blocks.py and the block fuzzer.

The model is rewritten and planned; LiteRT's reference kernels run the rewritten model with all
intermediate tensors kept; each fused block's Halide kernel is fed the block's inputs from that run
and must reproduce the block's outputs (tolerance: opcheck.FLOAT_RTOL). An int8 model whose
reference kernels would abort runs on the builtin kernels instead (tflite_tools.run.reference_resolver);
int8 outputs must be within one quantization step (tests/test_lowering_int8.py says why).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import halide as hl
import numpy as np

import tflite_tools
from fusion.ecg import build_ecg
from fusion.plan import plan_fusion
from fusion.rewrite import rewrite
from halide_gen.block import build_block
from halide_gen.jit import JitKernel, argument_arrays
from halide_gen.lower import LoweringError
from halide_gen.lowering_options import LoweringOptions
from halide_gen.schedule import schedule_cpu
from halide_gen.schedule.params import X86, CpuParams
from opcheck import BLOCK_FP16_RTOL, FLOAT_RTOL
from tflite_tools import runtime
from tflite_tools.model.ir import Model
from tflite_tools.run import compare, quantized_outputs, reference_resolver

RTOL = {"fp32": FLOAT_RTOL, "fp16": BLOCK_FP16_RTOL}


def block_kind(names: list[str]) -> str:
    """A coarse label of what a block computes, for coverage."""
    s = set(names)
    if {"CONV_2D", "DEPTHWISE_CONV_2D"} <= s:
        return "inverted residual"
    if {"BATCH_MATMUL", "SOFTMAX"} <= s:
        return "attention core"
    for heavy in ("CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED", "BATCH_MATMUL"):
        if heavy in s:
            return heavy.lower() + " + epilogue"
    if s & {"MEAN", "SUM", "SOFTMAX", "MAX_POOL_2D", "AVERAGE_POOL_2D"}:
        return "reduction / normalisation"
    if s <= {"RESHAPE", "TRANSPOSE", "CONCATENATION", "SLICE", "GATHER", "SQUEEZE", "EXPAND_DIMS"}:
        return "data movement"
    return "elementwise chain"


def check_model_blocks(model: Model | str | Path, precision: str = "fp32", params: CpuParams = X86,
                       seed: int = 3, allow_unlowered: bool = False, scale_floor: float = 1e-30,
                       target: str | None = None) -> Counter:
    """Checks every planned block of `model` (a Model, or a path) against LiteRT under the CPU
    schedule `params`, compiled for `target` (a Halide target string; default this CPU's), one kernel per identity (each block runs the first kernel built for its
    identity, on its own arguments, as in a bundle); returns the block kinds checked. A block with no lowering fails the check
    unless `allow_unlowered` (random graphs: fuse leaves such a block to TFLite). Float errors are
    relative to max(max|ref|, `scale_floor`): a graph built at unit scale passes 1.0, since one
    output element that cancels to near zero (a 100-term dot product summing to 0.05) has a rounding
    error relative to its terms, not to itself."""
    model = tflite_tools.parse(tflite_tools.serialize(model)) if isinstance(model, Model) else tflite_tools.load(model)
    rewrite(model)
    data = tflite_tools.serialize(model)
    model = tflite_tools.parse(data)
    sg = model.main
    index = {id(t): k for k, t in enumerate(sg.tensors)}
    interp = runtime.make_interpreter(data, resolver=reference_resolver(model), preserve_all_tensors=True)
    runtime.run(interp, runtime.random_inputs(interp, seed))
    plan = plan_fusion(build_ecg(sg))
    kinds: Counter = Counter()
    jits: dict[str, JitKernel] = {}  # one kernel per identity, run for every block of it, as a bundle does
    for block in plan.blocks:
        if block.opaque_reason:
            continue
        ops = [plan.ecg.nodes[i].op for i in block.ops]
        try:
            lowered = build_block(block.name, ops, block.outputs, LoweringOptions(precision=precision))
        except LoweringError:
            if not allow_unlowered:
                raise
            continue
        if lowered.identity not in jits:
            jits[lowered.identity] = JitKernel(lowered, target=hl.Target(target) if target else None,
                                               schedule=lambda k: schedule_cpu(k, params))
        feeds = {id(t): interp.get_tensor(index[id(t)]) for t in block.inputs}
        got = jits[lowered.identity](argument_arrays(lowered, feeds))
        for t, out in zip(block.outputs, got):
            ref = interp.get_tensor(index[id(t)])
            if ref.dtype.kind == "f":
                err = np.abs(ref.astype(np.float64) - out).max() / max(float(np.abs(ref).max()), scale_floor)
                assert err <= RTOL[precision], f"{block.name} {[o.name for o in ops]}: {t.name} error {err:.3g}"
            elif t.type_name == "INT8":  # quantized: within one step of the builtin kernels
                assert np.abs(ref.astype(np.int32) - out).max() <= 1, f"{block.name}: {t.name}"
            else:
                assert np.array_equal(ref, out), f"{block.name}: {t.name}"
        kinds[block_kind([op.name for op in ops])] += 1
    return kinds


def check_fused_model(source: Path, out: Path, cache: Path, options: dict[str, str] | None = None,
                      seed: int = 0) -> dict:
    """Fuses `source` into `out` for the host, runs the fused model with its delegate (claim:all
    unless `options` say otherwise) on seeded inputs, and asserts its outputs match LiteRT's
    reference kernels running the *original* model; returns the delegate's claims report."""
    from tflite_tools.fuse import fuse
    from tflite_tools.run import run

    result = fuse(source, out, target="host", cache_dir=cache)
    reference = runtime.make_interpreter(source, reference_resolver(source))
    inputs = runtime.random_inputs(reference, seed)
    for k, array in enumerate(inputs):
        np.save(out / f"in{k}.npy", array)
    fused = run(result.model, result.library, [str(out / f"in{k}.npy") for k in range(len(inputs))],
                compare_reference=False, options={"claim": "all", **(options or {})})
    names = [d["name"] for d in reference.get_output_details()]
    errors = compare(fused.outputs, runtime.run(reference, inputs), names, quantized=quantized_outputs(reference))
    assert all(e.ok for e in errors), errors
    assert fused.claims is not None and fused.claims["graph_matches"], fused.claims
    return fused.claims
