"""`tflite_tools fuse MODEL -o OUT`: the whole job, model to delegate.

    result = fuse("model.tflite", "out/", target="host")

rewrite -> plan -> lower -> schedule -> compile -> package. OUT receives:

    model.fused.tflite         the rewritten model, still valid on stock TFLite, carrying the
                               structure fingerprint the delegate checks
    lib<model>_dnnfusion.so    the delegate: every compiled block, the Halide runtime, the runtime
                               (host and arm64-linux: linked here, with the cross compiler for ARM;
                               GPU targets add the API: lib<model>_dnnfusion_opencl.so, ..._vulkan_fp16.so)
    android/arm64-v8a/         for arm64-android: a CMake project that builds the delegate with
                               the NDK (built here too when $ANDROID_NDK is set)
    plan.json                  blocks, kernels, claims and measurements, for tools
    report.md                  the same for people
    model_explorer/            Model Explorer's per-node data: blocks.json, claims.json
    plan.svg                   the plan, where Graphviz is installed
    asm/<block>/               with emit_asm (--emit-asm): each kernel's assembly (.s) and Halide's
                               lowered statement (.stmt), one pair per sub-target

Like the CLI, this module is the outer layer: it imports every stage (fusion, halide_gen) at the
top; nothing in the stages imports it. OUT switches from its old contents to the new set in one
step once everything succeeded, and is never a folder with files fuse did not write
(tflite_tools.outdir).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection, Sequence

import halide as hl

from fusion.pipeline import plan_model
from fusion.report import PlanSummary, to_dot
from fusion.rewrite.fold import restore_decoded
from halide_gen.aot import KernelArtifact, compile_kernel, error_line
from halide_gen.block import build_block_for
from halide_gen.bundle import (JNI_LIBRARY, BundleBlock, BundleGraph, BundleInfo, bound_constants,
                               build_cmake_project, bundle_source, claim_groups, dynamic_model, indistinguishable,
                               link_delegate, write_cmake_project)
from halide_gen.lower import LoweringError
from halide_gen.targets import ANDROID_MIN_SDK, TargetSpec, default_target, target_spec

from .explorer import block_overlay, claims_overlay, write_overlay
from .fuse_report import format_report
from .measure import MEASURED_THREADS, BlockTimings, best_default_claim
from .model.errors import ModelError, ToolchainError
from .model.fingerprint import METADATA_NAME, model_fingerprint, subgraph_fingerprint
from .model.ir import Model, Subgraph
from .model.reader import load
from .model.variants import ShapeVariant, parse_variant, resolve, with_shapes
from .model.writer import save, serialize
from .outdir import OutputFolder
from .runtime import tensor_shapes
from .windows import DIRECTIONS, Carriers, carriers, window_arguments

Progress = Callable[[int, int, str], None]  # (done, total, what)


@dataclass
class KernelRecord:
    """What happened to one planned block."""

    block: str
    ops: list[str]
    nodes: list[int]
    subgraph: int = 0  # the subgraph whose nodes these are
    shapes: str | None = None  # the `--shape` variant it is compiled at (None: the model's own shapes)
    kernel: str | None = None  # the C entry point, when the block has a kernel
    in_place_kernel: str | None = None  # its in-place form's, for a block that updates a KV cache
    # The directions ("batch", "sequence") along which the delegate may run it on windows of the
    # compiled steps where the model is resized (tflite_tools.windows).
    windows: list[str] = field(default_factory=list)
    cached: bool = False
    skipped: str | None = None  # why the block stays with TFLite
    schedule: str = "template"  # the CPU templates, or the autoscheduler that measured faster
    ratio: float | None = None  # measured Halide / (LiteRT + XNNPACK) on the host
    profitable: bool = False


@dataclass
class SubgraphResult:
    """What fuse made of a subgraph besides the entry one (another signature, a control-flow body)."""

    index: int
    name: str  # Model.subgraph_label: its blocks are named `<name>.block_NNN`
    summary: PlanSummary
    decoders: int = 0  # as FuseResult.decoders, for this subgraph


@dataclass
class VariantResult:
    """A subgraph compiled again at other input shapes (`fuse --shape`): the delegate runs these
    kernels when the model is resized to them."""

    index: int  # the subgraph
    name: str  # `<subgraph label>@<shapes>`: the claims report's subgraph_name when it runs
    shapes: str  # as given to --shape
    prefix: str  # its blocks' names start with it


@dataclass
class FuseResult:
    """The files written and the per-block record."""

    out: Path
    model: Path
    library: Path | None  # None for Android without $ANDROID_NDK: see android_project
    plan_json: Path
    report_md: Path
    kernels: list[KernelRecord] = field(default_factory=list)
    seconds: float = 0.0
    android_project: Path | None = None
    default_claim: str = "profitable"  # the delegate's policy when its options name none
    default_claim_threaded: str = "profitable"  # the same where the interpreter runs several threads
    whole_model_ms: dict[str, float] = field(default_factory=dict)  # --measure: median per policy, one thread
    whole_model_ms_threaded: dict[str, float] = field(default_factory=dict)  # the same at MEASURED_THREADS
    # DEQUANTIZE / DENSIFY nodes put back at the front of the fused model's entry subgraph to decode
    # stored weights: a plan block's op index (rewritten graph) + decoders = its node index in
    # model.fused.tflite (SubgraphResult.decoders for the other subgraphs).
    decoders: int = 0
    subgraphs: list[SubgraphResult] = field(default_factory=list)  # the others, when the model has more
    variants: list[VariantResult] = field(default_factory=list)  # one per --shape
    summary: PlanSummary | None = None  # the entry subgraph's rewrite and plan (SubgraphResult: the others)
    sizes: dict[str, int | None] = field(default_factory=dict)  # bytes: original_model, fused_model, library

    @property
    def claimable_nodes(self) -> int:
        """Nodes inside blocks that have a kernel (at the model's own shapes: a `--shape` variant's
        blocks replace the same nodes)."""
        return sum(len(k.nodes) for k in self.kernels if k.kernel and k.shapes is None)


# The longest model stem a library name keeps: file names stop at 255 bytes on every filesystem
# an app or a phone uses, and `lib` + `_dnnfusion_vulkan_fp16.so` take 28 of them.
MAX_STEM = 200


def library_name(model_path: str | os.PathLike, spec: TargetSpec) -> str:
    """`lib<model>_dnnfusion.so` (the stem made a safe file name), with the GPU API for GPU
    targets (`lib<model>_dnnfusion_opencl.so`): one app can ship the CPU and GPU builds side by side.
    A stem past MAX_STEM keeps its start and a digest of the whole (a 245-character model name made a
    name the linker could not create)."""
    stem = re.sub(r"[^0-9A-Za-z_]", "_", Path(model_path).stem) or "model"
    if len(stem) > MAX_STEM:
        stem = f"{stem[:MAX_STEM - 9]}_{hashlib.sha256(stem.encode()).hexdigest()[:8]}"
    return f"lib{stem}_dnnfusion{spec.library_suffix}.so"


def _set_metadata(model: Model, name: str, value: bytes) -> None:
    model.metadata = [(k, v) for k, v in model.metadata if k != name] + [(name, value)]


def fuse(model_path: str | os.PathLike, out_dir: str | os.PathLike, target: str | None = None, fast_math: bool = False,
         measure: bool = False, cost: object | None = None, cache_dir: Path | None = None,
         progress: Progress | None = None, debug_runtime: bool = False,
         autoschedulers: bool = False, emit_asm: bool = False, shapes: Sequence[str] = (),
         trace: Callable[[str], None] | None = None) -> FuseResult:
    """Fuses a model into OUT (see the module docstring) for `target` (None: halide_gen.targets.
    default_target, "host" unless $DNNFUSION_TARGET names another). `measure` times every block against
    LiteRT + XNNPACK on this host (cached by kernel identity) and marks only faster ones
    profitable; otherwise every compiled float block of a CPU target counts as profitable, int8
    blocks where TargetSpec.int8_claimed_unmeasured says, blocks holding a dynamic-range op on x86
    and ARMv8.2 (TargetSpec.hybrid_claimed_unmeasured); GPU targets' blocks do not.
    `debug_runtime` links Halide's debug runtime, which traces device copies and kernel launches
    (delegate log_level:verbose).
    `autoschedulers` times Halide's autoschedulers against the templates per block where the
    target's kernels run here (the CPU for host; the OpenCL / Vulkan device for host-opencl /
    host-vulkan: Anderson2021 and Li2018) and compiles the fastest. With `measure`, the whole model
    is also timed under each claim policy (and XNNPACK alone) and the fastest becomes the delegate's
    default, so by default the fused model is never slower than LiteRT + XNNPACK here. Raises
    ModelError on input the compiler cannot take. `emit_asm` keeps every kernel's .s and .stmt in
    OUT/asm/<block>/. `shapes` (`[SIGNATURE:]INPUT=DIMS[,...]`, tflite_tools.model.variants) names
    input shapes to compile every block of that subgraph at too: the delegate runs those kernels when
    the model is resized to them. `trace` receives each rewrite and the graph after each pass
    (fuse --verbose)."""
    spec = _checked_target(target, measure, autoschedulers)
    variants = [parse_variant(text) for text in shapes]
    start = time.perf_counter()
    model = load(model_path)
    if len(model.subgraphs) == 0:
        raise ModelError(f"{model_path}: the model has no subgraph")
    # The output location is checked before hours of compiling, not after.
    staging = OutputFolder.prepare(out_dir)
    job = _Job(Path(model_path), spec, cache_dir, progress, measure, autoschedulers, emit_asm, debug_runtime)
    try:
        _check_room(staging, job.model_path)
        summaries = [plan_model(model, fast_math=fast_math, cost=cost, config=spec.plan_config(), subgraph=i,
                                prefix=block_prefix(model, i), trace=trace) for i in range(len(model.subgraphs))]
        # The rewritten model's bytes, which LiteRT sizes at other shapes (variants, the resizes' carriers).
        content = serialize(model) if variants or spec.gpu_api is None else b""
        shaped = _shaped_subgraphs(model, content, variants)
        job.blocks = sum(len(summaries[v.index].plan.blocks) for v in shaped) + \
            sum(len(summary.plan.blocks) for summary in summaries)
        graphs = [g for i, summary in enumerate(summaries)
                  for g in _compile_subgraph(job, model, i, summary, [v for v in shaped if v.index == i], content)]
        _withhold_indistinguishable(model, graphs)
        own = [g for g in graphs if g.variant is None]
        fingerprint = model_fingerprint([subgraph_fingerprint(model.subgraphs[g.index], bound_constants(g.blocks))
                                         for g in own])
        _set_metadata(model, METADATA_NAME, fingerprint.encode())
        library, claims = _package(job, model, fingerprint, graphs, staging.path)
        out = staging.out
        result = FuseResult(
            out=out, model=out / "model.fused.tflite",
            library=out / library.relative_to(staging.path) if library else None,
            plan_json=out / "plan.json", report_md=out / "report.md",
            kernels=[r for g in graphs for r in g.records],
            seconds=time.perf_counter() - start, android_project=out / ANDROID_PROJECT if job.android else None,
            default_claim=claims.one_thread, default_claim_threaded=claims.threaded,
            whole_model_ms=claims.one_thread_ms, whole_model_ms_threaded=claims.threaded_ms,
            decoders=graphs[0].decoders, subgraphs=[SubgraphResult(g.index, g.name, g.summary, g.decoders)
                                                    for g in own[1:]],
            variants=[VariantResult(v.index, v.name, v.variant.text, v.prefix) for v in shaped],
            sizes=_sizes(job.model_path, staging.path / "model.fused.tflite", library), summary=summaries[0])
        _write_plan(job, result, model, summaries[0], fingerprint, staging.path)
        staging.commit()
    finally:
        staging.discard()
    return result


ANDROID_PROJECT = Path("android") / "arm64-v8a"  # where an Android target's CMake project goes in OUT

# Room OUT needs beyond the fused model (which is at most the original's size): the delegate library
# and the reports. A disk that fills while linking said only "ld returned 1 exit status".
LIBRARY_ROOM = 64 << 20


def _check_room(staging: OutputFolder, model: Path) -> None:
    """Refuses (ToolchainError, one line) an OUT whose disk cannot hold the outputs, before compiling."""
    need = model.stat().st_size + LIBRARY_ROOM
    free = shutil.disk_usage(staging.path).free
    if free < need:
        raise ToolchainError(f"-o {staging.out}: {free >> 20} MiB free on its disk; the fused model and the delegate "
                             f"need about {need >> 20} MiB")


@dataclass
class _Job:
    """What every stage of one fuse() call needs to know."""

    model_path: Path
    spec: TargetSpec
    cache_dir: Path | None
    progress: Progress | None
    measure: bool
    autoschedulers: bool
    emit_asm: bool
    debug_runtime: bool
    blocks: int = 0  # planned blocks: the progress total
    done: int = 0  # blocks compiled (or left to TFLite) so far

    @property
    def android(self) -> bool:
        """True for Android targets: the delegate is a CMake project for the NDK."""
        return self.spec.packaging == "android-cmake"

    def report(self, done: int, what: str) -> None:
        """Progress, when the caller asked for it: `done` of the planned blocks, then what follows."""
        if self.progress:
            self.progress(done, self.blocks, what)


def _checked_target(target: str, measure: bool, autoschedulers: bool):
    """The target's spec (None: the default target), refusing what cannot be done for it here (ModelError)."""
    try:
        spec = target_spec(target or default_target())
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    if measure and spec.family != "x86":
        raise ModelError(f"--measure times blocks against LiteRT on this host's CPU; it cannot for target {target}")
    if autoschedulers:
        try:
            spec.jit_target()
        except ValueError as exc:
            raise ModelError(f"--autoschedulers times kernels here: {exc}") from None
    return spec


def block_prefix(model: Model, index: int) -> str:
    """What the names of subgraph `index`'s blocks start with: nothing in the entry subgraph (one-
    subgraph models keep `block_NNN`), `<label>.` in the others (`decode.block_003`)."""
    return f"{re.sub(r'[^0-9A-Za-z_]', '_', model.subgraph_label(index))}." if index else ""


@dataclass
class _Shaped:
    """A subgraph at the input shapes one --shape names: every tensor's shape as LiteRT sizes it."""

    variant: ShapeVariant
    index: int  # the subgraph
    shapes: list[tuple[int, ...] | None]  # by tensor index (None: LiteRT gave it none)
    prefix: str  # its blocks' names start with it
    name: str  # `<subgraph label>@<input>=<dims>,...`


def _shaped_subgraphs(model: Model, content: bytes, variants: Sequence[ShapeVariant]) -> list[_Shaped]:
    """Each variant's subgraph and tensor shapes, from LiteRT run on the rewritten model (`content`:
    its bytes; its tensors are the ones the plans index); ModelError where a name is unknown or
    LiteRT refuses the shapes."""
    shaped = []
    for k, variant in enumerate(variants, 1):
        index, inputs = resolve(model, variant)
        try:
            shapes = tensor_shapes(content, index, inputs)
        except ModelError as exc:
            raise ModelError(f"--shape {variant.text!r}: {exc}") from None
        label = model.subgraph_label(index)
        dims = ",".join(f"{name.removeprefix(label + ':')}={'x'.join(map(str, d))}" for name, d in variant.inputs)
        shaped.append(_Shaped(variant, index, shapes, f"{block_prefix(model, index)}shape{k}.", f"{label}@{dims}"))
    return shaped


@dataclass
class _Graph:
    """One subgraph, or one of its shape variants, as it goes through compiling and packaging."""

    index: int
    name: str  # Model.subgraph_label, `@<shapes>` after it for a variant
    summary: PlanSummary
    records: list[KernelRecord]
    blocks: list[BundleBlock]  # those with a kernel
    subgraph: Subgraph  # the model's, or a variant's copy at its shapes
    variant: _Shaped | None = None
    decoders: int = 0  # stored-weight decoders restored at its front (_restore_stored_weights)


def _resize_carriers(job: _Job, sg: Subgraph, content: bytes, index: int) -> tuple[Carriers | None, ...]:
    """Per direction (windows.DIRECTIONS), which tensors of `sg` (subgraph `index`, at its shapes)
    carry it (windows.carriers), for a CPU target, whose kernels the delegate may run on windows of
    a resized model's steps; else None each. `content`: the rewritten model's bytes."""
    if job.spec.gpu_api is not None:
        return (None,) * len(DIRECTIONS)
    return tuple(carriers(sg, content, index, d) for d in range(len(DIRECTIONS)))


def _compile_subgraph(job: _Job, model: Model, index: int, summary: PlanSummary,
                      shaped: Sequence[_Shaped], content: bytes) -> list[_Graph]:
    """Compiles subgraph `index`'s planned blocks, and again at each variant's shapes under the same
    plan (so its nodes are the same), then puts the stored weights back in each; each graph's blocks
    may run on windows of a resized model's steps where LiteRT (sizing `content`, the rewritten
    model's bytes) says their tensors carry the steps."""
    sg, label = model.subgraphs[index], model.subgraph_label(index)
    found = _resize_carriers(job, sg, content, index)
    graphs = [_Graph(index, label, summary, *_compile_blocks(job, sg, summary.plan.blocks, found), sg)]
    for variant in shaped:
        copy, copies = with_shapes(sg, variant.shapes)
        blocks = [replace(b, name=variant.prefix + b.name.removeprefix(block_prefix(model, index)),
                          outputs=[copies[id(t)] for t in b.outputs]) for b in summary.plan.blocks]
        records, bundle_blocks = _compile_blocks(job, copy, blocks, _resize_carriers(job, copy, content, index))
        for record in records:
            record.shapes = variant.variant.text
        graphs.append(_Graph(index, variant.name, summary, records, bundle_blocks, copy, variant))
    for graph in graphs:
        for record in graph.records:
            record.subgraph = index
        graph.decoders = _restore_stored_weights(graph.subgraph, graph.records, graph.blocks)
    for graph in graphs[1:]:
        if _structure(graph.subgraph) != _structure(sg):  # the delegate would find other nodes there
            _withhold(graph, "its copy at these shapes lost the subgraph's structure")
    return graphs


def _structure(sg: Subgraph) -> list[tuple]:
    """What the bundle's node tables record of a subgraph: each node's operator and tensor indices."""
    index = {id(t): i for i, t in enumerate(sg.tensors)}
    return [(op.opcode.builtin, tuple(-1 if t is None else index.get(id(t), -2) for t in (*op.inputs, *op.outputs)))
            for op in sg.operators] + [len(sg.tensors)]


def _withhold(graph: _Graph, why: str, blocks: Collection[str] | None = None) -> None:
    """Leaves the named blocks of `graph` (all, by default) to TFLite, saying why."""
    for record in graph.records:
        if record.kernel and (blocks is None or record.block in blocks):
            record.kernel, record.profitable, record.skipped = None, False, why
    graph.blocks = [b for b in graph.blocks if blocks is not None and b.name not in blocks]


def _bundled(model: Model, graphs: list[_Graph]) -> list[BundleGraph]:
    """The graphs the bundle holds: those with a kernel, and the entry subgraph's always (the delegate
    then says the model matched and nothing was claimed there, rather than that nothing matched)."""
    return [BundleGraph(g.index, g.name, g.subgraph.tensors, g.subgraph.operators, g.blocks)
            for g in graphs if g.blocks or (g.index == 0 and g.variant is None)]


def _withhold_indistinguishable(model: Model, graphs: list[_Graph]) -> None:
    """Leaves to TFLite every block the delegate could run on nodes of another subgraph that
    compute something else (halide_gen.bundle.indistinguishable)."""
    withheld = indistinguishable(model.subgraphs, _bundled(model, graphs))
    for graph in graphs:
        for name in {b.name for b in graph.blocks} & withheld.keys():
            _withhold(graph, withheld[name], {name})


def _compile_blocks(job: _Job, sg, plan_blocks, found: Sequence[Carriers | None] = ()
                    ) -> tuple[list[KernelRecord], list[BundleBlock]]:
    """Lowers, schedules and compiles every planned block (through the kernel cache); returns a
    record per block and the bundle blocks of those with a kernel, each with the axes of the tensors
    it takes in windows along each direction it may run so (`found`: per direction, carriers')."""
    timings = BlockTimings(job.cache_dir) if job.measure or job.autoschedulers else None
    records: list[KernelRecord] = []
    blocks: list[BundleBlock] = []
    for block in plan_blocks:
        ops = [sg.operators[i] for i in block.ops]
        record = KernelRecord(block.name, [op.name for op in ops], list(block.ops))
        records.append(record)
        job.report(job.done, f"{block.name} ({'+'.join(record.ops[:4])}{'+...' if len(ops) > 4 else ''})")
        job.done += 1
        if block.opaque_reason:
            record.skipped = block.opaque_reason
            continue
        try:
            # Lowered as the kernel will be: the forms decide its arguments (packed weights).
            lowered = build_block_for(job.spec, block.name, ops, block.outputs)
            if job.autoschedulers:
                record.schedule = timings.best_schedule(lowered.identity, block, ops, job.spec.name)
            artifact = compile_kernel(ops, block.outputs, job.spec.name, job.cache_dir,
                                      emit_asm=job.emit_asm, schedule=record.schedule)
            _check_interface(artifact, lowered)
            in_place = _in_place_form(job, ops, block, record.schedule, artifact)
        except LoweringError as exc:
            record.skipped = f"no lowering: {exc}"
            continue
        except BUILD_FAILURES as exc:
            # A fault of the code generator on this block, not of the model: the block stays with
            # TFLite and the rest of the model is fused.
            record.skipped = f"cannot be built ({type(exc).__name__}): {error_line(exc)}"
            warnings.warn(f"{block.name} ({'+'.join(record.ops)}) is left to TFLite: {record.skipped}", BlockWarning,
                          stacklevel=2)
            continue
        record.kernel, record.cached = artifact.function, artifact.cached
        record.in_place_kernel = in_place.function if in_place is not None else None
        if job.measure:
            record.ratio = timings.ratio(artifact.identity, block, ops, record.schedule)
            record.profitable = record.ratio < 1.0
        else:
            record.profitable = job.spec.claims_unmeasured(ops)
        windows = {} if artifact.scratch or in_place is not None else _windows(ops, lowered, block.outputs, found)
        record.windows = [DIRECTIONS[d] for d in sorted(windows)]
        blocks.append(BundleBlock(block.name, block.ops, lowered.arguments, block.outputs, artifact, record.profitable,
                                  bound=lowered.bound, in_place=in_place, windows=windows))
    for name, why in claim_groups(sg.operators, blocks).items():
        record = next(r for r in records if r.block == name)
        record.kernel, record.profitable, record.skipped = None, False, why
        blocks = [b for b in blocks if b.name != name]
    if timings is not None:
        timings.save()
    return records, blocks


def _in_place_form(job: _Job, ops, block, schedule: str, artifact: KernelArtifact) -> KernelArtifact | None:
    """The in-place form of a block that updates a KV cache (halide_gen.block.build_block), for a CPU
    target: the delegate runs it where the caller passes the cache in and out as one buffer. GPU
    kernels write device buffers copied back whole, so they have none."""
    if not artifact.updates_in_place or job.spec.gpu_api is not None:
        return None
    try:
        return compile_kernel(ops, block.outputs, job.spec.name, job.cache_dir, emit_asm=job.emit_asm,
                              schedule=schedule, in_place=True)
    except (LoweringError, *BUILD_FAILURES) as exc:
        # The plain kernel still serves: it is correct on a shared buffer too, only slower.
        warnings.warn(f"{block.name}: no in-place form ({error_line(exc)})", BlockWarning, stacklevel=2)
        return None


class BlockWarning(UserWarning):
    """A block the code generator failed to build: it stays with TFLite (the CLI prints one line)."""


# What building one block may raise besides LoweringError when the code generator has a fault: Halide's
# own errors (a schedule it refuses) and Python's. The machine's faults (OSError: a full disk) and
# bad input (ModelError) still end the fuse.
BUILD_FAILURES = (hl.HalideError, ArithmeticError, AssertionError, AttributeError, LookupError, NotImplementedError,
                  RuntimeError, TypeError, ValueError)


def _restore_stored_weights(sg: Subgraph, records: list[KernelRecord], blocks: list[BundleBlock]) -> int:
    """Puts fp16, int8 and sparse weights back in their stored form with the DEQUANTIZE / DENSIFY
    nodes that decode them (fusion.rewrite.fold.restore_decoded), so the fused model is no larger
    than the original; the compiler has already seen the decoded values. The decoders go first,
    so the records' and blocks' node indices move by their number, which is returned."""
    decoders = restore_decoded(sg)
    for item in (*records, *blocks):
        item.nodes = [n + decoders for n in item.nodes]
    return decoders


@dataclass
class _DefaultClaims:
    """The claim policies a bundle holds for interpreters that name none (one thread, and more),
    and with `fuse --measure` the whole-model medians (ms per policy) that chose them."""

    one_thread: str  # as BundleInfo holds them until `--measure` chooses
    threaded: str
    one_thread_ms: dict[str, float] = field(default_factory=dict)
    threaded_ms: dict[str, float] = field(default_factory=dict)


def _package(job: _Job, model: Model, fingerprint: str, graphs: list[_Graph],
             folder: Path) -> tuple[Path | None, _DefaultClaims]:
    """Writes the delegate (or the Android project), the fused model and any assembly into
    `folder`; returns the library (None for Android without an NDK) and the default claim
    policies (measured with `measure`)."""
    job.report(job.blocks, "linking")
    # A library even when no block has a kernel: it loads, claims nothing and says so, so
    # scripts need no special case.
    info = BundleInfo(job.model_path.name, job.spec.name, fingerprint, _bundled(model, graphs),
                      dynamic=dynamic_model(model.subgraphs))
    blocks = info.blocks
    name = library_name(job.model_path, job.spec)
    library: Path | None = folder / name
    if job.android:
        project = write_cmake_project(bundle_source(info), blocks, job.spec.name, folder / ANDROID_PROJECT,
                                      name, job.cache_dir)
        library = _build_with_ndk(project, folder / ".build", name)
        shutil.rmtree(folder / ".build", ignore_errors=True)
    else:
        link_delegate(bundle_source(info), blocks, job.spec.name, library, job.cache_dir, job.debug_runtime)
    save(model, folder / "model.fused.tflite")
    for block in blocks:
        for path in (path for kernel in block.kernels() for path in kernel.extra):
            (folder / "asm" / block.name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, folder / "asm" / block.name / path.name)
    claims = _DefaultClaims(info.default_claim, info.default_claim_threaded)
    if job.measure and blocks and not job.android:
        job.report(job.blocks, "timing the whole model")
        fused = folder / "model.fused.tflite"
        claims.one_thread, claims.one_thread_ms = best_default_claim(fused, library, threads=1)
        claims.threaded, claims.threaded_ms = best_default_claim(fused, library, threads=MEASURED_THREADS)
        if (claims.one_thread, claims.threaded) != (info.default_claim, info.default_claim_threaded):
            info.default_claim, info.default_claim_threaded = claims.one_thread, claims.threaded
            link_delegate(bundle_source(info), blocks, job.spec.name, library, job.cache_dir,
                          job.debug_runtime)
    return library, claims


def _write_plan(job: _Job, result: FuseResult, fused: Model, summary, fingerprint: str, folder: Path) -> None:
    """plan.json (for tools), report.md (for people), Model Explorer's overlays of the fused model and,
    with Graphviz, plan.svg."""
    out = result.out
    plan = {"model": str(job.model_path), "target": job.spec.name, "fingerprint": fingerprint,
            "library": str(result.library.relative_to(out)) if result.library else None,
            "android_project": ANDROID_PROJECT.as_posix() if job.android else None,
            "default_claim": result.default_claim, "whole_model_ms": result.whole_model_ms,
            "default_claim_threaded": result.default_claim_threaded,
            "whole_model_ms_threaded": result.whole_model_ms_threaded,
            "decoders": result.decoders, "bytes": result.sizes, **summary.to_json(),
            "subgraphs": [{"index": s.index, "name": s.name, "decoders": s.decoders, **s.summary.to_json()}
                          for s in result.subgraphs],
            "variants": [vars(v) for v in result.variants],
            "kernels": [vars(r) for r in result.kernels]}
    (folder / "plan.json").write_text(json.dumps(plan, indent=1))
    (folder / "report.md").write_text(format_report(result, summary, str(job.model_path), job.spec.name))
    (folder / EXPLORER).mkdir()
    write_overlay(block_overlay(result, fused), folder / EXPLORER / "blocks.json")
    write_overlay(claims_overlay(result, fused), folder / EXPLORER / "claims.json")
    _write_svg(to_dot(summary), folder / "plan.svg")


# Model Explorer's per-node data for the fused model (tflite_tools.explorer), in OUT.
EXPLORER = "model_explorer"


def _write_svg(dot: str, path: Path) -> None:
    """The plan drawn by Graphviz where its `dot` is installed (nothing otherwise: the plan is in
    report.md and `fuse --dot` writes the source)."""
    if shutil.which("dot") is None:
        return
    done = subprocess.run(["dot", "-Tsvg", "-o", str(path)], input=dot, text=True, capture_output=True, timeout=120)
    if done.returncode != 0:
        raise ToolchainError(f"Graphviz could not draw the plan: {error_line(done.stderr)}")


def _sizes(original: Path, fused: Path, library: Path | None) -> dict[str, int | None]:
    """File sizes an app pays for: the original model, the fused one and the delegate library
    (None while an Android library waits for the NDK)."""
    return {"original_model": original.stat().st_size, "fused_model": fused.stat().st_size,
            "library": library.stat().st_size if library is not None else None}


def _build_with_ndk(project: Path, build: Path, name: str) -> Path | None:
    """Builds the Android project with $ANDROID_NDK's toolchain; None when the NDK is not set."""
    ndk = os.environ.get("ANDROID_NDK")
    if not ndk:
        return None
    toolchain = Path(ndk) / "build" / "cmake" / "android.toolchain.cmake"
    if not toolchain.exists():
        raise ModelError(f"ANDROID_NDK={ndk}: no build/cmake/android.toolchain.cmake there")
    build_cmake_project(project, build, [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}", "-DANDROID_ABI=arm64-v8a",
                                         f"-DANDROID_PLATFORM=android-{ANDROID_MIN_SDK}"])
    built = project / name
    shutil.copy2(build / name, built)
    if (build / JNI_LIBRARY).exists():  # the JNI library Java goes through (the NDK always builds it)
        shutil.copy2(build / JNI_LIBRARY, project / JNI_LIBRARY)
    return built


def _windows(ops, lowered, outputs, found: Sequence[Carriers | None]) -> dict[int, dict[int, int]]:
    """Per direction along which the block's kernel may run on windows of a resized model's steps:
    the axis carrying it of each tensor the kernel then takes in windows (tensor id -> axis)."""
    windows: dict[int, dict[int, int]] = {}
    for d, carried in enumerate(found):
        cut = window_arguments(ops, [a.tensor for a in lowered.arguments], outputs, carried)
        if cut is not None:
            windows[d] = {t: carried[t] for t in (*cut, *(id(o) for o in outputs))}
    return windows


def _check_interface(artifact, lowered) -> None:
    """The compiled kernel is the block's own: built from the same identity, taking exactly the
    buffers the bundle will pass; anything else is a compiler bug, never a guess."""
    expected = ([list(a.shape) for a in lowered.arguments], [list(t.shape) for t, _ in lowered.outputs])
    found = ([a["shape"] for a in artifact.arguments], [o["shape"] for o in artifact.outputs])
    if artifact.identity != lowered.identity or expected != found:
        raise RuntimeError(f"kernel {artifact.function} takes {found}, block {lowered.name} passes {expected}"
                           if expected != found else f"kernel {artifact.function} was built for another block "
                           f"than {lowered.name}")


