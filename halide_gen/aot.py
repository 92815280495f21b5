"""Ahead-of-time compilation of block kernels, per target, through an on-disk compile cache.

Targets are described in halide_gen/targets.py (TargetSpec, one entry per target).

Kernels are compiled without the Halide runtime (`no_runtime`); `compile_runtime` emits it once
per target for a bundle. Each kernel's function is named after its identity (BlockKernel.identity:
its ops, outputs and every constant value it bakes in), so identical blocks share one kernel and
one cache entry, and blocks that differ in any of it never do. Callers run a kernel through its
argv entry point (`<name>_argv`), which a multitarget library's dispatch provides (halide_gen.dispatch)
and a single target's Halide (with `<name>` and `<name>_metadata`). Cache entries are verified before use
(halide_gen.cache) and keyed by the generator's own source, so editing a lowering or a schedule
retires every kernel it may have changed without anyone remembering to.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import halide as hl
import numpy as np

from fusion import mapping
from tflite_tools.model import fingerprint
from tflite_tools.model.ir import Operator, Tensor

from .block import BlockKernel, build_block_for
from .cache import cached_entry
from .lower import LoweringError
from .dispatch import archive_builds, build_function
from .schedule import schedule_from, schedule_variant
from .targets import TargetSpec, target_spec
from .values import tflite_type_name



@functools.cache
def generator_digest() -> str:
    """SHA-256 (16 hex digits) of the code generator's own source (generator_sources) and Halide's
    version: what, besides a block and a target, decides the code a kernel holds."""
    digest = hashlib.sha256(hl.__version__.encode() if hasattr(hl, "__version__") else b"")
    for path in generator_sources():
        digest.update(str(path.relative_to(Path(__file__).parent.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def generator_sources() -> list[Path]:
    """The files generator_digest hashes: this package's Python files, the identity's canonical
    form (tflite_tools.model.fingerprint), which decides which blocks share a kernel, and the op
    classification the schedules read (fusion.mapping: which ops are elementwise, which Many-to-Many)."""
    return sorted(Path(__file__).parent.rglob("*.py")) + [Path(fingerprint.__file__), Path(mapping.__file__)]


@dataclass
class KernelArtifact:
    """A compiled kernel in the cache."""

    identity: str  # what it was built from (BlockKernel.identity)
    function: str  # the C entry point
    library: Path  # static library (.a) with the kernel (all sub-targets for multitarget)
    header: Path
    arguments: list[dict]  # per kernel argument: name, type, shape (TFLite order, packed), pack
    outputs: list[dict]
    scratch: list[dict] = field(default_factory=list)  # type, shape: extra outputs the caller allocates (GPU)
    # (argument, output) pairs an in-place form may update in place (BlockKernel.updates_in_place)
    updates_in_place: list[list[int]] = field(default_factory=list)
    extra: list[Path] = field(default_factory=list)  # .s / .stmt when asked for
    cached: bool = False


# Scratch buffers smaller than this stay the kernel's own on Vulkan (_compile_into): the region
# granule of halide_gen.targets.VULKAN_ALLOC_CONFIG.
VULKAN_GRANULE = 64


def kernel_name(identity: str) -> str:
    """The C function name of the kernel with this identity."""
    return f"dnnf_{identity[:20]}"


def cache_key(identity: str, spec: TargetSpec, emit_asm: bool, schedule: str = "template",
              in_place: bool = False) -> str:
    """What a compiled kernel depends on: the block's identity, its form (plain or in place), the
    target, the schedule source, the generator and Halide."""
    text = json.dumps([identity, spec.name, spec.halide, spec.int8_rounding, generator_digest(), emit_asm, schedule]
                      + (["in_place"] if in_place else []))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def kernel_cache(cache_dir: Path | str | None = None) -> Path:
    """The kernel cache's folder: `cache_dir`, else $DNNFUSION_CACHE_DIR/kernels (see
    fusion.cost.default_cache_dir); absolute, since the archiver and linker that read its entries
    run in folders of their own."""
    from fusion.cost import default_cache_dir

    return Path(cache_dir).absolute() if cache_dir is not None else default_cache_dir() / "kernels"


def _describe(t: Tensor) -> dict:
    return {"name": t.name, "type": t.type_name, "shape": list(t.shape)}


def compile_kernel(
    ops: Sequence[Operator],
    outputs: Sequence[Tensor],
    target: str,
    cache_dir: Path | None = None,
    emit_asm: bool = False,
    schedule: str = "template",
    in_place: bool = False,
) -> KernelArtifact:
    """Compiles a block for `target`, or returns the cached kernel of the same identity (the block
    is lowered first: only its lowering knows which constants the kernel bakes in).

    `schedule` is "template" (the hand-written families in halide_gen.schedule), a variant of
    them (schedule.TEMPLATE_VARIANTS) or the name of one of Halide's autoschedulers
    (halide_gen.profile.choose_schedule says which is faster).

    `in_place` compiles the block's in-place form (halide_gen.block.build_block): the same
    interface, with the outputs of `updates_in_place` written only where the update lands.

    The cache entry (halide_gen.cache) is verified before use and rebuilt when damaged.
    """
    spec = target_spec(target)
    root = kernel_cache(cache_dir)
    identity = build_block_for(spec, "identity", ops, outputs).identity
    name = f"{spec.name}-{cache_key(identity, spec, emit_asm, schedule, in_place)}"

    def build(folder: Path) -> None:
        _compile_into(folder, ops, outputs, identity, spec, emit_asm, schedule, in_place)

    entry, cached = cached_entry(root, name, build)
    return _load(entry, cached, identity)


def _scheduled_kernel(spec: TargetSpec, name: str, ops: Sequence[Operator], outputs: Sequence[Tensor], identity: str,
                      schedule: str, target: hl.Target, in_place: bool) -> BlockKernel:
    """The block lowered under the kernel's own name and scheduled for one Halide target."""
    kernel = build_block_for(spec, name, ops, outputs, in_place=in_place)
    if kernel.identity != identity:
        raise RuntimeError(f"lowering {kernel.name} twice gave two identities: it depends on something it does not record")
    schedule_from(kernel, spec, schedule, target)
    if spec.gpu_api == "vulkan":
        # Halide's Vulkan runtime clears a fresh buffer; for a 4-byte scratch buffer (a softmax's
        # row max) that clear wrote past the end of its memory block on lavapipe (valgrind). Under
        # 64 bytes (its allocator's granule here), a kernel allocates its own as before: the runtime
        # pools those, and measured on every reference model none is allocated after the first invoke.
        kernel.scratch = [v for v in kernel.scratch
                          if int(np.prod(v.shape)) * v.func.type().bits() // 8 >= VULKAN_GRANULE]
    return kernel


def _compile_into(folder: Path, ops: Sequence[Operator], outputs: Sequence[Tensor], identity: str,
                  spec: TargetSpec, emit_asm: bool, schedule: str, in_place: bool) -> None:
    """Lowers, schedules and compiles a block into `folder`: the static library, its header,
    kernel.json (what the bundle needs to call it) and, with emit_asm, .s / .stmt files.

    Each Halide target is compiled from a kernel scheduled for it (schedule_variant: the x86
    builds' register tiles differ); a multitarget library dispatches among them
    (halide_gen.dispatch)."""
    fn = kernel_name(identity) + ("_in_place" if in_place else "")
    targets = spec.targets()
    # Every schedule made before anything compiles: one the generator cannot make is its fault, not
    # the target's. A Func takes one schedule, so each variant lowers the block again.
    kernels: dict = {}
    for target in targets:
        variant = schedule_variant(spec, schedule, target)
        if variant not in kernels:
            kernels[variant] = _scheduled_kernel(spec, fn, ops, outputs, identity, schedule, target, in_place)

    def compile_one(outputs_: dict, name: str, target: hl.Target) -> None:
        kernel = kernels[schedule_variant(spec, schedule, target)]
        kernel.aot_pipeline().compile_to(outputs_, [arg.param for arg in kernel.arguments], name, target)

    try:
        if len(targets) > 1:
            objects = [folder / f"{build_function(fn, k)}.o" for k in range(len(targets))]
            for k, (target, obj) in enumerate(zip(targets, objects)):
                compile_one({hl.OutputFileType.object: str(obj)}, build_function(fn, k), target)
            archive_builds(folder, fn, spec.halide, objects, spec.name)
        else:
            compile_one({hl.OutputFileType.static_library: str(folder / f"{fn}.a"),
                         hl.OutputFileType.c_header: str(folder / f"{fn}.h")}, fn, targets[0])
    except hl.HalideError as exc:
        # What the target cannot express (64-bit integers on Vulkan, say) leaves the block to
        # TFLite, as an op without a lowering does.
        raise LoweringError(f"{spec.name} cannot compile it: {error_line(exc)}") from None
    extra = []
    if emit_asm:
        for k, target in enumerate(targets):
            suffix = f"_{k}" if len(targets) > 1 else ""
            compile_one({hl.OutputFileType.assembly: str(folder / f"{fn}{suffix}.s"),
                         hl.OutputFileType.stmt: str(folder / f"{fn}{suffix}.stmt")}, fn, target)
            extra += [f"{fn}{suffix}.s", f"{fn}{suffix}.stmt"]
    kernel = kernels[schedule_variant(spec, schedule, targets[0])]
    meta = {
        "function": fn,
        "library": f"{fn}.a",
        "header": f"{fn}.h",
        "target": spec.name,
        "halide_targets": list(spec.halide),
        "arguments": [{**_describe(a.tensor), "type": a.type_name, "shape": list(a.shape), "pack": a.pack}
                      for a in kernel.arguments],
        "outputs": [_describe(t) for t, _ in kernel.outputs],
        "scratch": [{"type": tflite_type_name(v.func.type()), "shape": list(v.shape)} for v in kernel.scratch],
        "updates_in_place": [list(pair) for pair in kernel.updates_in_place],
        "extra": extra,
    }
    (folder / "kernel.json").write_text(json.dumps(meta, indent=1))


def error_line(exc: BaseException) -> str:
    """The first non-empty line of an error's message (Halide's run to dozens), without Halide's
    "Error: " prefix: what a declined block's reason says."""
    line = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    return line.removeprefix("Error: ")


def _load(entry: Path, cached: bool, identity: str) -> KernelArtifact:
    meta = json.loads((entry / "kernel.json").read_text())
    return KernelArtifact(
        identity=identity,
        function=meta["function"],
        library=entry / meta["library"],
        header=entry / meta["header"],
        arguments=meta["arguments"],
        outputs=meta["outputs"],
        scratch=meta["scratch"],
        updates_in_place=meta["updates_in_place"],
        extra=[entry / name for name in meta["extra"]],
        cached=cached,
    )


def compile_runtime(target: str, cache_dir: Path | None = None, debug: bool = False) -> Path:
    """The Halide runtime for `target` as one object file (shared by every kernel of a bundle).

    `debug` builds Halide's debug runtime, which prints every device allocation, copy and kernel
    launch (the delegate routes those lines to its log at log_level:verbose).
    """
    spec = target_spec(target)
    root = kernel_cache(cache_dir)
    key = hashlib.sha256(json.dumps([spec.halide, generator_digest(), debug]).encode()).hexdigest()[:16]

    def build(folder: Path) -> None:
        # The baseline (last) target's runtime serves a multitarget library's every variant.
        runtime_target = hl.Target(spec.halide[-1])
        if debug:
            runtime_target = runtime_target.with_feature(hl.TargetFeature.Debug)
        hl.compile_standalone_runtime(str(folder / "halide_runtime.o"), runtime_target)

    entry, _ = cached_entry(root, f"runtime-{spec.name}{'-debug' if debug else ''}-{key}", build)
    return entry / "halide_runtime.o"
