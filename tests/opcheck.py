"""Running a model's ops as one Halide block next to LiteRT's reference kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

import tflite_tools
from halide_gen.block import build_block
from halide_gen.jit import JitKernel
from halide_gen.lowering_options import LoweringOptions
from halide_gen.values import FLOAT16_MAX
from tflite_tools import runtime
from tflite_tools.model.ir import Model
from tflite_tools.run import reference_resolver

# Float tolerance, relative to the output's scale: max |halide - ref| <= FLOAT_RTOL * max |ref|.
# Halide sums and evaluates transcendentals in a different order / with different polynomials than
# the reference kernels, so bit equality is not expected; 1e-5 is ~80 ulps of the largest output,
# far below any real lowering mistake (a wrong index or option shows up as O(1) errors).
FLOAT_RTOL = 1e-5

# The same bound for fp16 storage (halide_gen.lowering_options.PRECISIONS): each op's result is rounded to
# half precision once, a relative error of at most 2^-11 ~ 4.9e-4 of that element; 1e-3 allows that
# rounding plus the float32 error above, and is still far below a lowering mistake.
FP16_RTOL = 1e-3

# A fused block rounds after every op, and a later op can amplify an earlier rounding (a variance
# subtracts a rounded mean): measured worst over the test models' blocks 1.5e-3 (a layer norm's
# ADD, MEAN, SQUARED_DIFFERENCE), 4.3e-4 for convolutions.
BLOCK_FP16_RTOL = 4e-3

# Half-precision arithmetic (the ARM targets' --cpu-precision fp16): convolutions and matrix products
# also sum in fp16, K products a rounding each; tests/test_half_arithmetic.py holds them to the bound
# of such sums, and every op here to run.RTOL_FP16, the tolerance whole models are held to.
HALF_ARITHMETIC_RTOL = 1e-2

# The precision ops are lowered with ("fp32", "fp16" storage, "fp16-arithmetic");
# tests/test_lowering.py runs every case with each.
PRECISION = "fp32"


def lowering_options() -> LoweringOptions:
    """The lowering's forms at PRECISION."""
    if PRECISION == "fp16-arithmetic":
        return LoweringOptions(precision="fp16", half_arithmetic=True, native_minmax=True)
    return LoweringOptions(precision=PRECISION)


def unary_model(op: str, shape: Sequence[int], **options) -> Model:
    """A model of one op on one float32 input of `shape`, its output the same shape."""
    from tflite_tools.model.builder import ModelBuilder

    b = ModelBuilder()
    b.output(b.op(op, [b.input("x", shape)], shape, **options))
    return b.build()


def binary_model(op: str, a_shape: Sequence[int], b_shape: Sequence[int], constant: np.ndarray | None = None,
                 dtype: str = "float32", out_dtype: str | None = None, **options) -> Model:
    """A model of one op on inputs `x` and `y` (`y` the constant `constant` where given), its output
    the broadcast shape; options that are None are left out."""
    from tflite_tools.model.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", a_shape, dtype)
    y = b.const("y", constant) if constant is not None else b.input("y", b_shape, dtype)
    out = tuple(np.broadcast_shapes(tuple(a_shape), tuple(b_shape)))
    b.output(b.op(op, [x, y], out, dtype=out_dtype, **{k: v for k, v in options.items() if v is not None}))
    return b.build()


def reference(model: Model, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Outputs from the LiteRT kernels `run.reference_resolver` names (its reference kernels, as a
    rule), or the builtin kernels for the few ops, such as CEIL, the reference resolver does not
    register."""
    data = tflite_tools.serialize(model)
    try:
        interp = runtime.make_interpreter(data, resolver=reference_resolver(model))
    except ValueError as exc:
        if "Didn't find op" not in str(exc):
            raise
        interp = runtime.make_interpreter(data, resolver="builtin")
    return runtime.run(interp, list(inputs))


def halide(model: Model, inputs: Sequence[np.ndarray], options: LoweringOptions | None = None) -> list[np.ndarray]:
    """Outputs of all the model's ops lowered as one Halide block (JIT), in `options`' forms (the
    defaults at PRECISION unless given)."""
    sg = model.main
    jit = JitKernel(build_block("block", sg.operators, sg.outputs, options or lowering_options()))
    return jit(jit.inputs_from({id(t): a for t, a in zip(sg.inputs, inputs)}))


def aot(model: Model, inputs: Sequence[np.ndarray], target: str, work: Path) -> list[np.ndarray]:
    """Outputs of all the model's ops as one kernel compiled ahead of time for `target` and run
    where that target runs here (natively, or under qemu-aarch64 for ARM64)."""
    from halide_gen.aot import compile_kernel
    from halide_gen.harness import build_runner
    from halide_gen.pack import pack

    sg = model.main
    artifact = compile_kernel(sg.operators, sg.outputs, target, cache_dir=work / "cache")
    runner = build_runner(artifact, target, work / "build")
    constants = {t.name: t.data for t in sg.tensors if t.is_constant}
    given = {t.name: a for t, a in zip(sg.inputs, inputs)}
    return runner([pack(d["pack"], constants[d["name"]]) if d["name"] in constants else given[d["name"]]
                   for d in artifact.arguments])


def compare(model: Model, make_inputs: Callable[[np.random.Generator], list[np.ndarray]] | None = None,
            rtol: float | None = None, seeds: Sequence[int] = (0,), options: LoweringOptions | None = None) -> float:
    """Runs both and asserts agreement (within FLOAT_RTOL, or FP16_RTOL under fp16 precision,
    unless `rtol` says otherwise); returns the worst relative error seen. `options`: the lowering's
    forms (opcheck.halide)."""
    if rtol is None:
        rtol = {"fp16": FP16_RTOL, "fp16-arithmetic": HALF_ARITHMETIC_RTOL}.get(PRECISION, FLOAT_RTOL)
    worst = 0.0
    for seed in seeds:
        if make_inputs is None:
            interp = runtime.make_interpreter(tflite_tools.serialize(model), resolver=reference_resolver(model))
            inputs = runtime.random_inputs(interp, seed)
        else:
            inputs = make_inputs(np.random.default_rng(seed))
        for ref, got in zip(reference(model, inputs), halide(model, inputs, options)):
            assert ref.shape == got.shape, (ref.shape, got.shape)
            if ref.dtype.kind == "f" and PRECISION != "fp32":  # beyond fp16's range, values saturate
                ref = np.clip(ref, -FLOAT16_MAX, FLOAT16_MAX)
            if ref.dtype.kind == "f":
                scale = max(float(np.abs(ref).max()), 1e-30)
                err = float(np.abs(ref.astype(np.float64) - got).max()) / scale
                assert err <= rtol, f"relative error {err:.3g} > {rtol}"
                worst = max(worst, err)
            else:
                assert ref.dtype == got.dtype, (ref.dtype, got.dtype)
                assert np.array_equal(ref, got), "integer / bool outputs differ"
    return worst
