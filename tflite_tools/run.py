"""`tflite_tools run MODEL [--delegate LIB] [--compare]`: run a model, optionally through a
dnnfusion delegate, and say how far its outputs are from LiteRT's reference kernels.

    result = run("out/model.fused.tflite", delegate="out/libmodel_dnnfusion.so", compare=True)
    result.ok            # every output within tolerance

Tolerance (float outputs): max|out - ref| <= RTOL * max|ref|, per output. Fused kernels
reassociate sums (vectorised partial sums, register-tiled accumulators) and use Halide's exp/tanh
where TFLite's reference kernels use libm, so whole models differ from the reference by rounding
that grows with depth. Measured on every test and reference model: at most 2.1e-6 of the output's
range (EfficientNet-B0's logits), so 1e-4 leaves a margin of ~50x and still catches any real
error. The bound is purely relative: random-weight CNNs end in logits of ~1e-10, and an absolute
floor would wave any answer through there. Quantized (int8) outputs may differ by one quantization
step (1 LSB): the integer kernels follow TFLite's reference arithmetic bit for bit, but LiteRT's
optimized kernels, the reference here, round a few requantizations the other way; in a deep int8
model those steps add up, so with a delegate a quantized output further off than that still passes
when LiteRT + XNNPACK alone is at least as far off on the same inputs, and a float output outside
the tolerance passes when stock LiteRT is outside it too and this output matches stock's
(`never_worse`: the delegate must not be worse than what its user had). A float output that a
DEQUANTIZE makes of an int8 tensor (an int8 model with float outputs) is held to either bound: the
float one, or 1 LSB of that tensor's scale (then no more steps off than stock, as an int8 output).
Other integer and bool outputs must match exactly. NaN and +-inf must be exactly where the reference
has them (a NaN there is a match: the kernels follow TFLite's float semantics, halide_gen/lower/ieee.py); the
tolerance applies to the finite rest.

A bundle built with `--gpu-precision fp16` stores every tensor a block computes in half precision
(relative rounding 2^-11 per op, compounded through the model), so its outputs are held to
RTOL_FP16 instead: measured at most 4.1e-4 on the test models (unet_tiny on lavapipe) and 1.5e-3
on the benchmark set (bench/zoo.py: bert_small), so 1e-2 leaves a margin and still catches a wrong kernel, whose
error is O(1). One built with `--cpu-precision fp16` also sums its products in half precision, K roundings
a sum, as XNNPACK's fp16 kernels do; its outputs are held to RTOL_HALF_ARITHMETIC: XNNPACK's own fp16 path
(FORCE_FP16, on the emulated Cortex-A76) is 1.7e-2 from the reference kernels on SegFormer-B0 at 512 x 512,
ours 1.5e-2, the other models measured 4e-4 to 2.0e-2 (bench/RESULTS.md, "ARM64: half precision"), so 5e-2
leaves a margin and still catches a wrong kernel. The delegate's report names its bundle's target, which says
the precision.

A dynamic-range model's float outputs (int8 weights, float activations: `model/hybrid.py`) depend
on how each FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D or BATCH_MATMUL with int8 weights rounds its
activations, quantized per row at run time in steps of 1/127 of the row's largest magnitude. Two
correct implementations round some elements a step apart (XNNPACK quantizes asymmetrically, TFLite's
reference symmetrically; inputs a float rounding apart can fall either side of a step), and
independent one-step differences along a path add like a random walk: an output D such ops deep is
held to sqrt(D) / 127 of its range (`hybrid_rtol`) — 0.055 for BERT-base or GPT-2 (48 on a path),
where LiteRT + XNNPACK alone is 0.009-0.020 from the reference on the real-size corpus
(bench/RESULTS.md), and a wrong kernel is O(1). Such outputs print stock LiteRT + XNNPACK's error
beside the delegate's.

The reference is LiteRT's BUILTIN_REF resolver (its reference kernels), with two exceptions
(`reference_resolver`): an int8 model with an op whose reference kernel aborts the process (an int8
SOFTMAX of logits quantized finer than 2^-26, as the random-weight MobileNetV2s' are) is compared
with the optimized builtin kernels (no XNNPACK), and a model with custom ops, which neither kernel set
can run, with LiteRT + XNNPACK.
The result names the reference it used (`RunResult.reference`; the CLI prints it).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from halide_gen.targets import TARGETS

from . import runtime
from .model.errors import ModelError
from .model.hybrid import hybrid_depths
from .model.ir import Model
from .model.reader import load, parse
from .outdir import check_unchanged
from .sharedlib import check_delegate_library

RTOL = 1e-4
RTOL_FP16 = 1e-2
RTOL_HALF_ARITHMETIC = 5e-2
QUANTIZED_LSB = 1  # how many quantization steps an int8 output may be off
HYBRID_STEPS = 127  # a dynamically quantized row's steps from zero to its largest magnitude


@dataclass
class OutputError:
    """How one output compares with the reference."""

    name: str
    max_abs: float
    max_rel: float  # max_abs / max|ref|
    ok: bool
    stock_max_abs: float | None = None  # LiteRT + XNNPACK alone, where compared (int8, dynamic-range outputs)
    rtol: float = RTOL  # the float tolerance it was held to


@dataclass
class RunResult:
    """Outputs, their comparison with the reference, and what the delegate claimed."""

    outputs: list[np.ndarray]
    errors: list[OutputError] = field(default_factory=list)
    claims: dict | None = None  # the delegate's report for the main graph
    rtol: float = RTOL  # the float tolerance the outputs were held to
    reference: str | None = None  # the resolver the outputs were compared with (REFERENCE_NAMES)

    @property
    def ok(self) -> bool:
        """True when every compared output is within tolerance."""
        return all(e.ok for e in self.errors)


def compare(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], names: Sequence[str],
            rtol: float | Sequence[float] = RTOL, quantized: Sequence[bool | float] = ()) -> list[OutputError]:
    """Per-output error against the reference: float outputs within `rtol` (one for all, or one per
    output) of the reference's largest finite magnitude, with NaN and +-inf exactly where the
    reference has them (a NaN matches a NaN); quantized outputs (where `quantized` says so) within 1 LSB, other integer
    outputs exact. A float output whose `quantized` entry is a step (`quantized_outputs`: an int8
    tensor dequantized) may instead be within 1 LSB of that step."""
    errors = []
    quantized = list(quantized) + [False] * (len(names) - len(quantized))
    rtols = [rtol] * len(names) if isinstance(rtol, (int, float)) else list(rtol)
    for name, out, ref, is_quantized, rtol in zip(names, outputs, reference, quantized, rtols):
        if out.dtype.kind == "f":
            infinite = np.isinf(ref)
            specials_match = (np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(np.isinf(out), infinite)
                              and np.array_equal(out[infinite], ref[infinite]))
            finite = np.isfinite(ref) & np.isfinite(out)
            diff = float(np.max(np.abs(out[finite].astype(np.float64) - ref[finite]), initial=0.0))
            scale = float(np.max(np.abs(ref[finite].astype(np.float64)), initial=0.0))
            step = 0.0 if isinstance(is_quantized, bool) else float(is_quantized)
            ok = specials_match and (diff <= rtol * scale or diff <= QUANTIZED_LSB * step)
        else:
            diff = float(np.max(np.abs(out.astype(np.int64) - ref.astype(np.int64)), initial=0))
            scale = float(np.max(np.abs(ref.astype(np.int64)), initial=0))
            ok = diff <= (QUANTIZED_LSB if is_quantized else 0)
        errors.append(OutputError(name, diff, diff / scale if scale else diff, ok, rtol=rtol))
    return errors


def read_claims(report: Path) -> dict | None:
    """The delegate's last report line for the entry subgraph (the last line if none matched),
    with "subgraphs": the last line of each subgraph the bundle matched, by subgraph name."""
    try:
        lines = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    matching = [line for line in lines if line.get("graph_matches")]
    entry = [line for line in matching if line.get("subgraph", 0) == 0]
    claims = (entry or matching or lines or [None])[-1]
    if claims is not None:
        claims = {**claims, "subgraphs": {line.get("subgraph_name"): line for line in matching}}
    return claims


def hybrid_rtol(depth: int, rtol: float = RTOL) -> float:
    """The float tolerance of an output `depth` dynamically quantized ops deep (see above)."""
    return max(rtol, math.sqrt(depth) / HYBRID_STEPS) if depth else rtol


def tolerance(claims: dict | None) -> float:
    """RTOL, or when the delegate claimed nodes with a half-precision bundle RTOL_FP16 (fp16 storage)
    or RTOL_HALF_ARITHMETIC (fp16 sums too)."""
    spec = TARGETS.get(str(claims.get("target"))) if claims else None
    if claims and claims.get("claimed_nodes") and spec is not None and spec.precision == "fp16":
        return RTOL_HALF_ARITHMETIC if spec.half_arithmetic else RTOL_FP16
    return RTOL


def quantized_outputs(interp, model: str | os.PathLike | bytes | Model | None = None) -> list[bool | float]:
    """Per output of an interpreter: True where it holds quantized integers (compared to 1 LSB);
    with the `model` it runs, a float output that a DEQUANTIZE makes of an int8 tensor gets that
    tensor's step (its largest scale) instead — an int8 model's answer in float units, as precise
    as its last int8 tensor (compared to 1 LSB of it) — and False otherwise."""
    flags: list[bool | float] = [np.dtype(d["dtype"]) in (np.int8, np.uint8, np.int16) and d["quantization"][0] != 0
                                 for d in interp.get_output_details()]
    if model is None:
        return flags
    model = _as_model(model)
    producers = model.main.producers()
    for k, tensor in enumerate(model.main.outputs[:len(flags)]):
        op = producers.get(id(tensor))
        if not flags[k] and op is not None and op.name == "DEQUANTIZE" and _has_quantized(op):
            flags[k] = float(np.max(op.inputs[0].quantization.scale))
    return flags


# LiteRT's int8 reference SOFTMAX forms beta * input_scale * 2^26 as a multiplier "greater than
# one" and aborts the process (TFLITE_CHECK in QuantizeMultiplierGreaterThanOne, not an error status)
# when it is not: logits quantized finer than 2^-26 (the random-weight MobileNetV2s' 7.8e-9).
SOFTMAX_SCALED_DIFF_BITS = 26  # 31 - softmax.cc's kScaledDiffIntegerBits (5)


def reference_aborts(op) -> bool:
    """Whether LiteRT's reference kernel for `op` would abort the process (see above)."""
    if op.name != "SOFTMAX" or not _has_quantized(op) or op.inputs[0].quantization is None:
        return False
    beta = float(getattr(op.options, "beta", 1.0)) if op.options is not None else 1.0
    scale = float(np.max(op.inputs[0].quantization.scale))
    return beta * scale * (1 << SOFTMAX_SCALED_DIFF_BITS) <= 1.0


# What each resolver name means in a report.
REFERENCE_NAMES = {
    "reference": "LiteRT reference kernels",
    "builtin": "LiteRT builtin kernels",
    "xnnpack": "LiteRT + XNNPACK",
}


def reference_resolver(model: str | os.PathLike | bytes | Model) -> str:
    """The LiteRT kernels a model's outputs are checked against: its reference kernels (the ground
    truth), except
    - "builtin" (the optimized kernels, no XNNPACK) when an int8 op's reference kernel would abort
      the process (`reference_aborts`);
    - "xnnpack" when the model has custom ops: neither kernel set registers any, while XNNPACK
      claims MediaPipe's (Convolution2DTransposeBias, MaxPoolingWithArgmax2D, MaxUnpooling2D), so
      LiteRT + XNNPACK is what runs such a model in stock LiteRT;
    - "xnnpack" when weights are quantized per block (LiteRT 2.3): the reference FULLY_CONNECTED
      reads them as if quantized per tensor and the optimized one skips the fused activation;
      XNNPACK computes the op (its block scales in bfloat16, which converters' scales are)."""
    model = _as_model(model)
    ops = [op for sg in model.subgraphs for op in sg.operators]
    if any(op.opcode.is_custom or _blockwise(op) for op in ops):
        return "xnnpack"
    if any(reference_aborts(op) for op in ops):
        return "builtin"
    return "reference"


def _blockwise(op) -> bool:
    return any(t is not None and t.quantization is not None and t.quantization.blockwise is not None
               for t in op.inputs)


def _as_model(model: str | os.PathLike | bytes | Model) -> Model:
    """A model given as a path, its bytes, or already parsed."""
    if isinstance(model, Model):
        return model
    return parse(bytes(model)) if isinstance(model, (bytes, bytearray)) else load(model)


def _has_quantized(op) -> bool:
    return any(t is not None and t.type_name in ("INT8", "UINT8", "INT16") and t.quantization is not None
               and t.quantization.scale is not None and len(t.quantization.scale) for t in (*op.inputs, *op.outputs))


def run(model: str | os.PathLike, delegate: str | os.PathLike | None = None, inputs: Sequence[str] = (),
        compare_reference: bool = True, threads: int = 1, options: dict[str, str] | None = None,
        seed: int = 0) -> RunResult:
    """Runs `model` (with LiteRT + XNNPACK for what the delegate does not claim) on the given
    .npy inputs or seeded random ones, and compares with LiteRT's reference kernels."""
    if not Path(model).is_file():
        raise ModelError(f"{model}: no such file")
    if delegate is not None:
        check_unchanged(delegate)  # garbage in a library's code crashes whoever loads it
    parsed = load(model)  # our checks first: LiteRT's own loader trusts more than it should
    with tempfile.TemporaryDirectory(prefix="dnnfusion-run-") as tmp:
        report = Path(tmp) / "claims.jsonl"
        delegates = []
        if delegate is not None:
            check_delegate_library(delegate)
            opts = {"report": str(report), **(options or {})}
            try:
                delegates.append(runtime.load_delegate(os.fspath(Path(delegate).resolve()), options=opts))
            except (ValueError, OSError, RuntimeError, AttributeError) as exc:
                raise ModelError(f"{delegate}: cannot load the delegate: {exc}") from None
        try:
            interp = runtime.make_interpreter(model, "xnnpack", threads, delegates=delegates)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"{model}: LiteRT cannot prepare the model: {exc}") from None
        arrays = runtime.model_inputs(interp, inputs, seed)
        try:
            result = RunResult(runtime.run(interp, arrays))
        except RuntimeError as exc:  # a kernel that fails reports through TFLite, never aborts
            raise ModelError(f"{model}: invoke failed: {exc}") from None
        result.claims = read_claims(report) if delegate is not None else None
    if compare_reference:
        result.reference = reference_resolver(parsed)
        try:
            expected = runtime.run(runtime.make_interpreter(model, result.reference, 1), arrays)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"{model}: the reference ({REFERENCE_NAMES[result.reference]}) failed: {exc}") from None
        names = [d["name"] for d in interp.get_output_details()]
        result.rtol = tolerance(result.claims)
        quantized = quantized_outputs(interp, parsed)
        depths = hybrid_depths(parsed.main)
        result.errors = compare(result.outputs, expected, names, [hybrid_rtol(d, result.rtol) for d in depths],
                                quantized)
        if delegate is not None and (not result.ok or any(depths)):
            never_worse(result.errors, result.outputs, quantized, model, arrays, expected, threads, depths)
    return result


def never_worse(errors: list[OutputError], outputs: Sequence[np.ndarray], quantized: Sequence[bool],
                model: str | os.PathLike, arrays: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                threads: int, depths: Sequence[int] = ()) -> None:
    """Accepts an output outside the tolerance when stock LiteRT + XNNPACK, on the same inputs, is
    no closer to the reference: stock LiteRT is what a user of the delegate had before.

    - quantized (or dequantized from int8): no more steps off than stock (a deep int8 model's
      requantizations round differently in each kernel set);
    - float: only when stock itself is outside the tolerance (XNNPACK's NaN and inf differ from the
      reference kernels', as where a NaN weight meets padding) and this output matches stock's.

    Outputs that dynamic quantization reaches (`depths`) get stock's error beside theirs either way.
    """
    stock = runtime.run(runtime.make_interpreter(model, "xnnpack", threads), arrays)
    depths = list(depths) + [0] * (len(errors) - len(depths))
    for k, (error, is_quantized) in enumerate(zip(errors, quantized)):
        if error.ok and not depths[k]:
            continue
        (stock_error,) = compare([stock[k]], [expected[k]], [error.name], error.rtol, [is_quantized])
        error.stock_max_abs = stock_error.max_abs
        if error.ok:
            continue
        if is_quantized:
            error.ok = error.max_abs <= stock_error.max_abs
        else:
            error.ok = not stock_error.ok and compare([outputs[k]], [stock[k]], [error.name], error.rtol)[0].ok