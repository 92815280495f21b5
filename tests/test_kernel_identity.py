"""Kernel identity: blocks share a kernel only when everything the kernel was built from agrees.

A kernel bakes in more than its block's shapes: a SLICE's begin, a PAD's amounts, a TRANSPOSE's
permutation, reduced axes, a property of int8 weights. Two blocks equal in shape but differing in
such a constant must get two kernels; two that differ only in weights (kernel arguments) share one.
The lowering records every constant it reads (halide_gen.lower.registry.OpContext.const) and
declares which inputs it may read (register(compile_time=...)); one canonical form
(tflite_tools.model.fingerprint) makes the kernel identity, the compile cache key and the model
fingerprint.

The pair models hold, for every declared compile-time input, two blocks of one shape that differ in
that constant (tests/twins.py makes the second), fused and compared with LiteRT's reference on x86,
ARM64 under qemu and OpenCL / Vulkan.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import numpy as np
import pytest

import tflite_tools
from conftest import REPO
from delegate_checks import invoke_elsewhere, planned_nodes
from fusion.ecg import build_ecg
from fusion.plan import plan_fusion
from fusion.signature import block_signature
from halide_gen.aot import compile_kernel, generator_sources
from halide_gen.block import build_block_for
from halide_gen.lower import LoweringError
from halide_gen.lower.registry import COMPILE_TIME_INPUTS, SHAPE_INPUTS
from halide_gen.targets import target_spec
from tflite_tools.fuse import fuse
from tflite_tools.model.builder import ModelBuilder, quantization
from tflite_tools.model.fingerprint import block_identity, subgraph_fingerprint
from tflite_tools.model.hybrid import is_hybrid
from tflite_tools.run import run
from twins import REDUCERS, twin_constants, with_twins

CASES = {}  # kind -> a function building the base ops of that kind's pair model


def _case(kind):
    def add(fn):
        CASES[kind] = fn
        return fn
    return add


def _i32(b: ModelBuilder, name: str, value) -> object:
    return b.const(name, np.array(value, np.int32))


@_case("float")
def _float_ops(b: ModelBuilder) -> list:
    x = b.input("x", [1, 8, 8, 4])
    sq = b.input("sq", [1, 4, 4, 4])
    table = b.input("table", [6, 4])
    grid = b.input("grid", [4, 4, 3])
    outs = [
        b.op("SLICE", [x, _i32(b, "begin", [0, 0, 0, 0]), _i32(b, "size", [1, 4, 8, 4])], [1, 4, 8, 4]),
        b.op("PAD", [x, _i32(b, "pads", [[0, 0], [1, 2], [0, 0], [0, 0]])], [1, 11, 8, 4]),
        b.op("PADV2", [x, _i32(b, "pads2", [[0, 0], [2, 0], [0, 1], [0, 0]]),
                       b.const("fill", np.array([0.5], np.float32))], [1, 10, 9, 4]),
        b.op("MIRROR_PAD", [x, _i32(b, "mpads", [[0, 0], [1, 2], [2, 1], [0, 0]])], [1, 11, 11, 4], mode="REFLECT"),
        b.op("TRANSPOSE", [sq, _i32(b, "perm", [0, 2, 1, 3])], [1, 4, 4, 4]),
        b.op("STRIDED_SLICE", [x, _i32(b, "sb", [0, 1, 0, 0]), _i32(b, "se", [1, 5, 8, 4]), _i32(b, "ss", [1, 1, 1, 1])],
             [1, 4, 8, 4]),
        # No axis can move: the twin changes the stride of the axis of one element.
        b.op("STRIDED_SLICE", [x, _i32(b, "tb", [0, 0, 0, 0]), _i32(b, "te", [1, 8, 8, 4]), _i32(b, "ts", [1, 2, 1, 1])],
             [1, 4, 8, 4]),
        *b.op("SPLIT", [_i32(b, "axis", [1]), x], [[1, 4, 8, 4]] * 2, num_splits=2),
        *b.op("SPLIT_V", [x, _i32(b, "sizes", [3, 5]), _i32(b, "vaxis", [1])], [[1, 3, 8, 4], [1, 5, 8, 4]], num_splits=2),
        *[b.op(op, [sq, _i32(b, f"{op}_axes", [1])], [1, 4, 4]) for op in REDUCERS],
        *[b.op(op, [sq, _i32(b, f"{op}_axis", [1])], [1, 4, 4], dtype="int32", output_type="INT32")
          for op in ("ARG_MAX", "ARG_MIN")],
        b.op("GATHER", [table, _i32(b, "rows", [0, 2, 5])], [3, 4], axis=0),
        b.op("GATHER_ND", [grid, _i32(b, "cells", [[0, 1], [3, 2]])], [2, 3]),
    ]
    return [b.op("TANH", [t], list(t.shape)) if t.type_name == "FLOAT32" else t for t in outs]


@_case("int8")
def _int8_ops(b: ModelBuilder) -> list:
    q = quantization(0.02, -5)
    x = b.input("x", [1, 8, 8, 16], "int8", quant=q)
    rng = np.random.default_rng(7)
    w_scales = rng.uniform(0.002, 0.01, 16).astype(np.float32)
    w = b.const("w", rng.integers(-127, 128, (1, 3, 3, 16)).astype(np.int8), quant=quantization(w_scales, 0, 3))
    bias = b.const("bias", rng.integers(-2000, 2000, 16).astype(np.int32), quant=quantization(0.02 * w_scales, 0, 0))
    return [
        b.op("SLICE", [x, _i32(b, "begin", [0, 2, 0, 0]), _i32(b, "size", [1, 4, 8, 16])], [1, 4, 8, 16], quant=q),
        b.op("PAD", [x, _i32(b, "pads", [[0, 0], [1, 2], [0, 0], [0, 0]])], [1, 11, 8, 16], quant=q),
        b.op("TRANSPOSE", [x, _i32(b, "perm", [0, 2, 1, 3])], [1, 8, 8, 16], quant=q),
        b.op("MEAN", [x, _i32(b, "axes", [1])], [1, 8, 16], quant=quantization(0.01, 1)),
        b.op("DEPTHWISE_CONV_2D", [x, w, bias], [1, 8, 8, 16], quant=quantization(0.05, 3), padding="SAME",
             stride_h=1, stride_w=1, depth_multiplier=1),
    ]


@_case("int16")
def _int16_ops(b: ModelBuilder) -> list:
    x = b.input("x", [1, 6, 6, 8], "int16", quant=quantization(3e-4, 0))
    return [b.op("MEAN", [x, _i32(b, "axes", [1])], [1, 6, 8], quant=quantization(2e-4, 0))]


@_case("hybrid")
def _hybrid_ops(b: ModelBuilder) -> list:
    x = b.input("x", [1, 8, 8, 16])
    rng = np.random.default_rng(8)
    w = b.const("w", rng.integers(-127, 128, (1, 3, 3, 16)).astype(np.int8),
                quant=quantization(rng.uniform(0.002, 0.01, 16).astype(np.float32), 0, 3))
    return [b.op("DEPTHWISE_CONV_2D", [x, w, b.const("bias", rng.standard_normal(16).astype(np.float32))],
                 [1, 8, 8, 16], dtype="float32", padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1)]


def pair_model(kind: str):
    """The base ops of `kind`, each reading a graph input, then a twin of each (tests/twins.py)."""
    b = ModelBuilder()
    b.output(*CASES[kind](b))
    return with_twins(b.build(), np.random.default_rng(1))


def _pairs(model):
    """(base op, its twin) for every base op of a pair model."""
    ops = model.main.operators
    half = len(ops) // 2
    return list(zip(ops[:half], ops[half:]))


def _kind(op) -> str:
    types = {t.type_name for t in (*op.inputs, *op.outputs) if t is not None and not t.is_constant}
    kind = "int16" if "INT16" in types else "int8" if "INT8" in types else "hybrid" if is_hybrid(op) else "float"
    return kind if (kind, op.name) in COMPILE_TIME_INPUTS else "float"


def test_every_compile_time_input_has_a_pair_that_differs_in_it():
    # A lowering that declares a new compile-time input needs a twin rule (tests/twins.py) and a
    # case here; without them this fails and names it.
    declared = {(kind, name, i) for (kind, name), inputs in COMPILE_TIME_INPUTS.items() for i in inputs}
    covered = set()
    for kind in CASES:
        for base, twin in _pairs(pair_model(kind)):
            for i, (a, b) in enumerate(zip(base.inputs, twin.inputs)):
                if a is not None and a.is_constant and not np.array_equal(a.data, b.data):
                    covered.add((_kind(base), base.name, i))
    # PAD has no input 2; PADV2's fill is it.
    declared.discard(("float", "PAD", 2))
    assert sorted(declared - covered) == []


def _one_op_identity(op, spec) -> tuple[str, object]:
    kernel = build_block_for(spec, "b", [op], list(op.outputs))
    return kernel.identity, kernel


@pytest.mark.parametrize("target", ["host", "arm64-linux", "host-opencl", "host-vulkan"])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_twins_get_two_identities_wherever_the_kernel_reads_the_constant(kind, target):
    # The identity covers what the kernel was built from on this target: a GPU kernel checks
    # constant GATHER indices when it is built (their values then count), a CPU kernel takes them as
    # an argument (twins then share it). Weights alone never split a kernel.
    spec = target_spec(target)
    for base, twin in _pairs(pair_model(kind)):
        try:
            (a, kernel), (b, _) = _one_op_identity(base, spec), _one_op_identity(twin, spec)
        except LoweringError:
            continue
        read = {i for (_, i) in kernel.bound}
        differs = {i for i, (x, y) in enumerate(zip(base.inputs, twin.inputs))
                   if x is not None and x.is_constant and not np.array_equal(x.data, y.data)}
        assert (a != b) == bool(read & differs), (base.name, read, differs)
        arguments = {id(arg.tensor) for arg in kernel.arguments}
        for i in differs - read:  # what the kernel did not read, it takes at run time
            assert id(base.inputs[i]) in arguments, (base.name, i)


def test_changing_any_constant_of_the_test_models_changes_the_identity_or_is_an_argument():
    # Every constant of every block of every test model: perturbed, either the identity changes,
    # or the kernel reads the constant as an argument, or the output shapes fix it (a RESHAPE's
    # shape). Anything else would be a value baked in silently. Constants an input's quantization
    # names (a blockwise one's scales) are arguments.
    spec = target_spec("host")
    checked = 0
    models = REPO / "tests" / "models"
    for path in sorted(models.glob("*.tflite")) + sorted(models.glob("fuzz/*.tflite")):
        model = tflite_tools.load(path)
        if len(model.subgraphs) != 1:
            continue
        sg = model.main
        plan = plan_fusion(build_ecg(sg))
        for block in plan.blocks:
            if block.opaque_reason:
                continue
            ops = [sg.operators[i] for i in block.ops]
            try:
                kernel = build_block_for(spec, "b", ops, block.outputs)
            except LoweringError:
                continue
            arguments = {id(arg.tensor) for arg in kernel.arguments}
            for k, op in enumerate(ops):
                for i, t in enumerate(op.inputs):
                    for named in t.quantization.tensors if t is not None and t.quantization is not None else ():
                        checked += 1
                        assert id(named) in arguments, (path.name, op.name, named.name)
                    if t is None or not t.is_constant or t.data is None or not t.data.size:
                        continue
                    if (k, i) not in kernel.bound:
                        assert id(t) in arguments or i in SHAPE_INPUTS[(_kind(op), op.name)], (path.name, op.name, i)
                        continue
                    twin = copy.copy(t)
                    twin.data = _perturbed(t.data)
                    changed = [copy.copy(o) for o in ops]
                    changed[k].inputs = [twin if j == i else u for j, u in enumerate(op.inputs)]
                    try:
                        other = build_block_for(spec, "b", changed, block.outputs)
                    except Exception:  # a value the op cannot take (a permutation no longer one)
                        continue
                    if "=" in kernel.bound[(k, i)]:
                        continue  # a property of the value (tests/twins.py flips it)
                    checked += 1
                    assert other.identity != kernel.identity, (path.name, op.name, i)
    assert checked > 10


def _perturbed(data: np.ndarray) -> np.ndarray:
    out = np.array(data, copy=True)
    flat = out.reshape(-1)
    flat[0] = flat[0] + 1 if out.dtype.kind == "f" else flat[0] ^ 1
    return out


def test_lowerings_read_constants_only_through_their_context():
    # OpContext.const and const_property record what a kernel bakes in; a `.data` read anywhere
    # else in the lowerings or schedules would bake in a value no identity covers.
    offenders = []
    for path in sorted((REPO / "halide_gen").rglob("*.py")):
        if path.name in ("registry.py", "jit.py"):  # the recording reader; run-time arguments
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "data":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def test_an_undeclared_compile_time_read_leaves_the_block_to_tflite(monkeypatch):
    from halide_gen.lower import registry

    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 4])
    b.output(b.op("TRANSPOSE", [x, _i32(b, "perm", [0, 2, 1, 3])], [1, 4, 4, 4]))
    op = b.build().main.operators[0]
    monkeypatch.setitem(registry.COMPILE_TIME_INPUTS, ("float", "TRANSPOSE"), ())
    with pytest.raises(LoweringError, match="reads input 1 at compile time without declaring it"):
        build_block_for(target_spec("host"), "b", [op], op.outputs)


def test_signature_identity_and_fingerprint_come_from_one_canonical_form():
    model = pair_model("float")
    sg = model.main
    plan = plan_fusion(build_ecg(sg))
    block = next(blk for blk in plan.blocks if [sg.operators[i].name for i in blk.ops] == ["SLICE", "TANH"])
    ops = [sg.operators[i] for i in block.ops]
    kernel = build_block_for(target_spec("host"), "b", ops, block.outputs)
    # The planner's signature is the identity's form without the bound constants.
    assert block_signature(plan.ecg, block.ops) == block_identity(ops, block.outputs)[:20]
    assert kernel.bound and kernel.identity == block_identity(ops, block.outputs, kernel.bound)
    assert kernel.identity != block_identity(ops, block.outputs)
    # The fingerprint covers the same bound values, keyed by node.
    bound = {(block.ops[k], i): text for (k, i), text in kernel.bound.items()}
    assert subgraph_fingerprint(sg, bound) != subgraph_fingerprint(sg)
    # Options2 and custom options enter every form.
    op = copy.copy(ops[1])
    op.custom_options = b"\x01"
    assert block_identity([ops[0], op], block.outputs) != block_identity(ops, block.outputs)


def test_blocks_differing_in_a_baked_constant_get_two_cache_entries(tmp_path):
    model = pair_model("float")
    (base, twin), *_ = _pairs(model)
    assert base.name == "SLICE"
    first = compile_kernel([base], base.outputs, "host-native", cache_dir=tmp_path)
    second = compile_kernel([twin], twin.outputs, "host-native", cache_dir=tmp_path)
    assert not second.cached and first.library.parent != second.library.parent
    assert first.function != second.function and first.identity != second.identity


def test_the_identity_form_is_part_of_the_generator_digest():
    # A changed identity scheme retires every cached kernel keyed by the old one.
    from tflite_tools.model import fingerprint

    assert Path(fingerprint.__file__) in generator_sources()


def _fuse_pairs(kind: str, target: str, tmp_path: Path):
    (tmp_path / "pairs.tflite").write_bytes(tflite_tools.serialize(pair_model(kind)))
    return fuse(tmp_path / "pairs.tflite", tmp_path / "out", target=target, cache_dir=tmp_path.parent / f"kid-{target}")


def _assert_own_kernels(result, target: str) -> None:
    """Blocks share a kernel only where the target's kernel takes the differing constant as an
    argument (GATHER indices on the CPU)."""
    by_kernel: dict[str, list] = {}
    for k in result.kernels:
        if k.kernel:
            by_kernel.setdefault(k.kernel, []).append(k.ops)
    shared = [ops for blocks in by_kernel.values() if len(blocks) > 1 for ops in blocks]
    allowed = () if "opencl" in target or "vulkan" in target else ("GATHER", "GATHER_ND")
    assert all(set(ops) & set(allowed) for ops in shared), shared


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_pairs_match_litert_through_the_delegate(kind, tmp_path):
    result = _fuse_pairs(kind, "host-native", tmp_path)
    _assert_own_kernels(result, "host-native")
    outcome = run(result.model, delegate=result.library, options={"claim": "all"})
    assert outcome.ok, outcome.errors
    assert outcome.claims["claimed_nodes"] == planned_nodes(result) and outcome.claims["claimed_nodes"]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["arm64-linux"])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_pairs_match_litert_on_arm64(kind, target, tmp_path, arm64_root):
    from arm64_rootfs import run_python

    result = _fuse_pairs(kind, target, tmp_path)
    _assert_own_kernels(result, target)
    errors, claims = invoke_elsewhere(lambda args: run_python(arm64_root, *args), result, tmp_path, seed=4)
    assert all(e.ok for e in errors), errors
    assert claims["claimed_nodes"] == planned_nodes(result) and claims["claimed_nodes"]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["host-opencl", "host-vulkan"])
def test_pairs_match_litert_on_the_gpu(target, tmp_path):
    import json

    from test_gpu_delegate import gpu_env, run_cli

    env = gpu_env(target.removeprefix("host-"))
    result = _fuse_pairs("float", target, tmp_path)
    _assert_own_kernels(result, target)
    proc = run_cli(["run", str(result.model), "--delegate", str(result.library), "--compare", "--json",
                    "--option", "claim=all"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"], report["outputs"]
    assert report["claims"]["claimed_nodes"] == planned_nodes(result) and report["claims"]["claimed_nodes"]
