"""The kernel bundle: a generated C++ table of a model's fused blocks, linked with their Halide
kernels, the Halide runtime and the delegate runtime (`delegate/`) into one shared library that
TFLite loads as an external delegate.

    blocks = [BundleBlock(...), ...]            # one per block that has a kernel
    info = BundleInfo(..., graphs=[BundleGraph(0, "main", tensors, operators, blocks), ...])
    link_delegate(bundle_source(info), info.blocks, "host", out / "libmodel_dnnfusion.so")

The table holds one graph per fused subgraph (each signature's, each control-flow body's) and
says, per block, which graph nodes it replaces (with their builtin codes and tensor indices),
which tensors each kernel argument reads (and how constants are packed), and the kernel's Halide
argv entry. The runtime picks the graph that matches the subgraph TFLite hands it and checks all
of it before it claims a block (delegate/src/claim.cc).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import halide as hl

from tflite_tools.model.errors import ToolchainError
from tflite_tools.model.fingerprint import bound_values, nodes_fingerprint
from tflite_tools.model.ir import Operator, Subgraph, Tensor
from tflite_tools.model.shapes import sized_at_run_time

from .aot import KernelArtifact, compile_runtime, kernel_cache
from .block import Argument
from .bundle_abi import ARG_SOURCE, ARG_SPEC, BLOCK_SPEC, BUNDLE, CLAIM_POLICY, GPU_API, GRAPH_SPEC, MAX_RANK, NODE_SPEC
from .bundle_abi import PACK, SCRATCH_SPEC, TENSOR_SPEC, TFLITE_TYPES, initializer
from .cache import cached_entry
from .pack import CHANNEL_TILE
from .runtime_build import LINK_OPTIONS, SYSTEM_LIBRARIES, compile_flags
from .targets import ANDROID_MIN_SDK, VULKAN_ALLOC_CONFIG, feature_words, target_spec
from .toolchain import archiver_for, compiler_for, run_tool

# The delegate runtime's sources: inside the package when installed from a wheel, else the
# checkout's delegate/ (an editable install).
_PACKAGED_RUNTIME = Path(__file__).resolve().parent / "delegate"
DELEGATE_DIR = _PACKAGED_RUNTIME if _PACKAGED_RUNTIME.is_dir() else Path(__file__).resolve().parent.parent / "delegate"
HALIDE_INCLUDE = Path(hl.__file__).parent / "include"

@dataclass
class BundleBlock:
    """A planned block that has a compiled kernel."""

    name: str
    nodes: Sequence[int]  # operator indices in the subgraph
    arguments: Sequence[Argument]  # the kernel's inputs in order (halide_gen.block.build_block)
    outputs: Sequence[Tensor]
    artifact: KernelArtifact
    profitable: bool
    group: int = 0  # claimed together with the blocks of the same nonzero group (claim_groups)
    # (op position in the block, input index) -> the constant value the kernel bakes in
    # (BlockKernel.bound): the model fingerprint covers them (bound_constants).
    bound: Mapping[tuple[int, int], str] = field(default_factory=dict)
    in_place: KernelArtifact | None = None  # the kernel's in-place form (halide_gen.block.build_block)
    # Per direction (0: the batch, 1: the sequence) along which the delegate may run the kernel on
    # windows of a resized model's steps: the axis carrying it of each tensor it then takes in
    # windows, by tensor id (tflite_tools.windows); the others it takes whole.
    windows: Mapping[int, Mapping[int, int]] = field(default_factory=dict)

    def kernels(self) -> list[KernelArtifact]:
        """The compiled kernels the block links: its kernel and its in-place form, if any."""
        return [self.artifact] + ([self.in_place] if self.in_place is not None else [])


@dataclass
class BundleGraph:
    """One fused subgraph: its tensors and operators as the fused model holds them, and the blocks
    that have a kernel."""

    index: int  # in the model
    name: str  # signature key, name or subgraph<N> (Model.subgraph_label)
    tensors: Sequence[Tensor]  # in file order
    operators: Sequence[Operator]  # in file order
    blocks: Sequence[BundleBlock]


@dataclass
class BundleInfo:
    """What the bundle says about the model as a whole, and its graphs."""

    model: str  # file name, for messages
    target: str
    fingerprint: str
    graphs: Sequence[BundleGraph]
    # Some subgraph has custom ops or tensors sized only as it runs (delegate/src/plugin.cc).
    dynamic: bool = False
    default_claim: str = "profitable"  # the delegate's claim policy when its options name none
    default_claim_threaded: str = "profitable"  # the same at more than one thread

    @property
    def blocks(self) -> list[BundleBlock]:
        """Every graph's blocks, in graph order."""
        return [b for g in self.graphs for b in g.blocks]


def bound_constants(blocks: Sequence[BundleBlock]) -> dict[tuple[int, int], str]:
    """Every constant value the bundle's kernels bake in, keyed by (node index, input index): what
    the model fingerprint covers besides the graph's structure (tflite_tools.model.fingerprint), so
    a bundle never matches a model whose baked constants differ from its kernels'."""
    return {(b.nodes[k], i): text for b in blocks for (k, i), text in b.bound.items()}


def taken_for(graph: BundleGraph, other: Subgraph) -> bool:
    """True when the delegate's graph check (claim.cc CheckGraph) accepts `other` as `graph`'s
    subgraph: as many nodes, with the same builtin codes in order, and no fewer tensors."""
    return (len(other.operators) == len(graph.operators) and len(other.tensors) >= len(graph.tensors)
            and all(a.opcode.builtin == b.opcode.builtin for a, b in zip(other.operators, graph.operators)))


def _node_io(sg: Subgraph, index_of: Mapping[int, int], n: int) -> tuple:
    """Node n as the delegate's block check sees it: builtin code, input and output tensor indices."""
    op = sg.operators[n]
    return (op.opcode.builtin, [-1 if t is None else index_of[id(t)] for t in op.inputs],
            [index_of[id(t)] for t in op.outputs])


def _block_form(sg: Subgraph, block: BundleBlock) -> str:
    """What the block's nodes compute in `sg` at any shapes: options, types, quantization and the
    values there at the block's bound keys."""
    values = bound_values(sg, [(block.nodes[k], i) for k, i in block.bound])
    return nodes_fingerprint(sg, block.nodes, {(k, i): values[(block.nodes[k], i)] for k, i in block.bound},
                             shapes=False)


def indistinguishable(subgraphs: Sequence[Subgraph], graphs: Sequence[BundleGraph]) -> dict[str, str]:
    """By block name, why a block cannot go in the bundle: the delegate would run it on nodes of
    another subgraph (a graph it takes for that subgraph, taken_for, whose block check, claim.cc
    CheckBlock, accepts those nodes: the same builtin codes reading and writing the same tensor
    indices) where they compute something else (other options, types, quantization or bound
    constants), which would give a wrong answer wherever the shapes agree. Nodes that compute the
    same at other sizes (prefill signatures per length) share the kernel."""
    index_of = [{id(t): i for i, t in enumerate(sg.tensors)} for sg in subgraphs]
    withheld: dict[str, str] = {}
    for graph in graphs:
        own = subgraphs[graph.index]
        others = [c for c, other in enumerate(subgraphs) if c != graph.index and taken_for(graph, other)]
        for block in graph.blocks:
            io = [_node_io(own, index_of[graph.index], n) for n in block.nodes]
            accepted = [c for c in others if all(n < len(subgraphs[c].operators) and
                                                 _node_io(subgraphs[c], index_of[c], n) == x
                                                 for n, x in zip(block.nodes, io))]
            form = _block_form(own, block) if accepted else None
            for c in accepted:
                if _block_form(subgraphs[c], block) != form:
                    withheld[block.name] = (f"the delegate could not tell its nodes from those of subgraph {c}, "
                                            "which have the same operators and tensors but compute something else")
                    break
    return withheld


# MediaPipe's argmax pooling writes indices in an encoding of its kernels' own (XNNPACK's and ours
# agree, MediaPipe's kernel differs): whoever reads them must be the same runtime.
ARGMAX_POOL = "CUSTOM:MaxPoolingWithArgmax2D"


def claim_groups(operators: Sequence[Operator], blocks: Sequence[BundleBlock]) -> dict[str, str]:
    """Sets each block's claim group: an argmax pooling's block and the blocks of every node that
    reads its indices are claimed together or not at all (the delegate enforces it, claim.cc).
    Returns, by block name, why a block cannot be claimed at all: a reader of its indices (or
    their producer) has no kernel."""
    block_of = {n: b for b in blocks for n in b.nodes}
    readers: dict[int, list[int]] = {}
    for n, op in enumerate(operators):
        for t in op.inputs:
            if t is not None:
                readers.setdefault(id(t), []).append(n)
    unclaimable: dict[str, str] = {}
    for n, op in enumerate(operators):
        if op.name != ARGMAX_POOL or len(op.outputs) < 2:
            continue
        members = [n, *readers.get(id(op.outputs[1]), [])]
        without = [m for m in members if m not in block_of]
        group = [block_of[m] for m in members if m in block_of]
        # An unpooling reading two poolings' indices joins their groups into one.
        joined = {b.group for b in group if b.group}
        number = min(joined) if joined else 1 + max((b.group for b in blocks), default=0)
        for b in blocks:
            if any(b is g for g in group) or b.group in joined:
                b.group = number
        for b in group:
            if without:
                unclaimable[b.name] = (f"it shares MediaPipe argmax indices with node {without[0]} "
                                       f"({operators[without[0]].name}), which has no kernel")
    return unclaimable


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dims(shape: Sequence[int]) -> str:
    if len(shape) > MAX_RANK:
        raise ValueError(f"rank {len(shape)} exceeds the bundle's {MAX_RANK}")
    return "{" + ", ".join(str(int(d)) for d in shape) + "}"


def _source(t: Tensor) -> tuple[str, Tensor | None]:
    """Where an argument's data comes from (bundle_abi.ARG_SOURCE) and, for a weight TFLite decodes
    (fusion.rewrite.fold.restore_decoded), the stored constant at the start of its decoding."""
    if t.is_constant:
        return "constant", None
    if t.decoded_from is None:
        return "computed", None
    while t.decoded_from is not None and not t.is_constant:
        t = t.decoded_from.inputs[0]
    return "decoded", t


def _table(ctype: str, name: str, items: list[str], empty: str) -> str:
    body = ",\n    ".join(items or [empty])
    return f"const {ctype} {name}[] = {{\n    {body}}};"


def _graph_tables(graph: BundleGraph, suffix: str) -> tuple[list[str], str]:
    """The C++ tables of one graph (names ending in `suffix`) and its GraphSpec initializer."""
    index = {id(t): i for i, t in enumerate(graph.tensors)}

    def idx(t: Tensor | None) -> int:
        return -1 if t is None else index[id(t)]

    touched: dict[int, Tensor] = {}
    window_axes: dict[int, list[int]] = {}  # tensor -> its axis carrying the batch, the sequence (-1: none)
    nodes, node_io, args, outputs, scratch, rows, index_bounds, in_place = [], [], [], [], [], [], [], []
    for b in graph.blocks:
        first_node, first_arg, first_out, first_scratch = len(nodes), len(args), len(outputs), len(scratch)
        first_in_place = len(in_place)
        if b.in_place is not None:
            in_place.extend(str(k) for pair in b.in_place.updates_in_place for k in pair)
        for n in b.nodes:
            op = graph.operators[n]
            ins, outs = [idx(t) for t in op.inputs], [idx(t) for t in op.outputs]
            nodes.append(initializer(NODE_SPEC, index=n, builtin_code=op.opcode.builtin, first_io=len(node_io),
                                     n_inputs=len(ins), n_outputs=len(outs)))
            node_io.extend(ins + outs)
        for a in b.arguments:
            touched[idx(a.tensor)] = a.tensor
            source, stored = _source(a.tensor)
            args.append(initializer(ARG_SPEC, tensor=idx(a.tensor), source=ARG_SOURCE.code(source),
                                    stored=idx(stored), pack=PACK.code(a.pack), half=int(a.half), rank=len(a.shape),
                                    dims=_dims(a.shape), first_index_bound=len(index_bounds),
                                    n_index_bounds=len(a.index_bounds),
                                    index_op=_c_string(a.index_op) if a.index_op else "nullptr"))
            index_bounds.extend(str(int(bound)) for bound in a.index_bounds)
        for t in b.outputs:
            touched[idx(t)] = t
            outputs.append(str(idx(t)))
        for desc in b.artifact.scratch:
            scratch.append(initializer(SCRATCH_SPEC, type=TFLITE_TYPES.value(desc["type"]), rank=len(desc["shape"]),
                                       dims=_dims(desc["shape"])))
        rows.append(initializer(BLOCK_SPEC, name=_c_string(b.name), signature=_c_string(b.artifact.function),
                                kernel=f"{b.artifact.function}_argv", profitable=int(b.profitable),
                                first_node=first_node, n_nodes=len(b.nodes), first_arg=first_arg,
                                n_args=len(b.arguments), first_output=first_out, n_outputs=len(b.outputs),
                                group=b.group, first_scratch=first_scratch, n_scratch=len(b.artifact.scratch),
                                in_place_kernel=f"{b.in_place.function}_argv" if b.in_place else "nullptr",
                                first_in_place=first_in_place, n_in_place=(len(in_place) - first_in_place) // 2,
                                windows=sum(1 << d for d in b.windows)))
        for d, axes in b.windows.items():
            for t in (*(a.tensor for a in b.arguments), *b.outputs):
                if id(t) in axes:
                    window_axes.setdefault(idx(t), [-1, -1])[d] = axes[id(t)]
    tensors = [initializer(TENSOR_SPEC, index=i, type=TFLITE_TYPES.value(t.type_name), rank=len(t.shape),
                           dims=_dims(t.shape), batch_axis=window_axes.get(i, [-1, -1])[0],
                           sequence_axis=window_axes.get(i, [-1, -1])[1]) for i, t in sorted(touched.items())]
    tables = [
        _table("int32_t", f"kGraphCodes{suffix}", [str(op.opcode.builtin) for op in graph.operators], "0"),
        _table("TensorSpec", f"kTensors{suffix}", tensors, "{}"),
        _table("NodeSpec", f"kNodes{suffix}", nodes, "{}"),
        _table("int32_t", f"kNodeTensors{suffix}", [str(i) for i in node_io], "0"),
        _table("ArgSpec", f"kArgs{suffix}", args, "{}"),
        _table("int32_t", f"kOutputs{suffix}", outputs, "0"),
        _table("ScratchSpec", f"kScratch{suffix}", scratch, "{}"),
        _table("int32_t", f"kIndexBounds{suffix}", index_bounds, "0"),
        _table("int32_t", f"kInPlace{suffix}", in_place, "0"),
        _table("BlockSpec", f"kBlocks{suffix}", rows, "{}"),
    ]
    spec = initializer(
        GRAPH_SPEC, subgraph=graph.index, name=_c_string(graph.name), n_tensors=len(graph.tensors),
        n_graph_nodes=len(graph.operators), graph_codes=f"kGraphCodes{suffix}", tensors=f"kTensors{suffix}",
        n_tensor_specs=len(tensors), nodes=f"kNodes{suffix}", node_tensors=f"kNodeTensors{suffix}",
        args=f"kArgs{suffix}", outputs=f"kOutputs{suffix}", blocks=f"kBlocks{suffix}", n_blocks=len(graph.blocks),
        scratch=f"kScratch{suffix}", index_bounds=f"kIndexBounds{suffix}", in_place=f"kInPlace{suffix}")
    return tables, spec


def bundle_source(info: BundleInfo) -> str:
    """C++ source defining `dnnfusion::bundle()` for the graphs of `info`."""
    spec = target_spec(info.target)
    tables, graphs = [], []
    for k, graph in enumerate(info.graphs):
        graph_tables, graph_spec = _graph_tables(graph, f"_{k}")
        tables += graph_tables
        graphs.append(graph_spec)
    functions = sorted({a.function for b in info.blocks for a in b.kernels()})
    cpu_words = feature_words(spec.required_cpu_features())
    lines = [
        f"// Generated by halide_gen/bundle.py for {info.model} ({info.target}). Do not edit.",
        '#include "dnnfusion/bundle.h"',
        "",
        'extern "C" {',
        *[f"int {fn}_argv(void** args);" for fn in functions],
        "}",
        "",
        "namespace dnnfusion {",
        "namespace {",
        *tables,
        _table("GraphSpec", "kGraphs", graphs, "{}"),
        _table("uint64_t", "kCpuFeatures", [f"0x{w:016x}ull" for w in cpu_words], "0"),
        "}  // namespace",
        "",
        "const Bundle& bundle() {",
        "  static const Bundle b = " + initializer(
            BUNDLE, model=_c_string(info.model), target=_c_string(info.target),
            fingerprint=_c_string(info.fingerprint), channel_tile=CHANNEL_TILE, graphs="kGraphs",
            n_graphs=len(info.graphs), default_claim=CLAIM_POLICY.value(info.default_claim),
            default_claim_threaded=CLAIM_POLICY.value(info.default_claim_threaded),
            allow_dynamic_tensors=int(info.dynamic), gpu_api=GPU_API.code(spec.gpu_api),
            half_precision=int(spec.precision == "fp16"), vulkan_alloc_config=_c_string(VULKAN_ALLOC_CONFIG),
            needs_dot_product=int(spec.dot_product), needs_half_arithmetic=int(spec.half_arithmetic),
            cpu_features="kCpuFeatures", n_cpu_feature_words=len(cpu_words)) + ";",
        "  return b;",
        "}",
        "",
        "}  // namespace dnnfusion",
        "",
    ]
    return "\n".join(lines)


def dynamic_model(subgraphs: Sequence) -> bool:
    """True when some subgraph has custom ops or tensors sized only as it runs: the delegate must
    then let TFLite keep the graph dynamic (Bundle::allow_dynamic_tensors, delegate/src/plugin.cc)."""
    return any(op.opcode.is_custom for sg in subgraphs for op in sg.operators) or \
        any(sized_at_run_time(sg.operators) for sg in subgraphs)


def runtime_sources() -> list[Path]:
    """The delegate runtime's C++ sources."""
    return sorted((DELEGATE_DIR / "src").glob("*.cc"))


def _flags() -> list[str]:
    return [*compile_flags(), f"-I{DELEGATE_DIR / 'include'}", f"-I{DELEGATE_DIR / 'src'}", f"-I{HALIDE_INCLUDE}"]


def runtime_objects(target: str, cache_dir: Path | None = None) -> list[Path]:
    """The delegate runtime compiled for `target`, cached by the sources' contents."""
    compiler = compiler_for(target)
    sources = runtime_sources()
    digest = hashlib.sha256()
    for path in sorted(DELEGATE_DIR.rglob("*")):
        if path.is_file() and path.suffix in (".cc", ".h", ".map"):
            digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join([compiler, *compile_flags()]).encode())
    cache = kernel_cache(cache_dir)

    def build(folder: Path) -> None:
        for src in sources:
            run_tool([compiler, *_flags(), "-c", str(src), "-o", str(folder / (src.stem + ".o"))], f"compiling {src.name}")

    entry, _ = cached_entry(cache, f"delegate-{target_spec(target).name}-{digest.hexdigest()[:16]}", build)
    return [entry / (src.stem + ".o") for src in sources]


def grouped_by_subtarget(compiler: str, kernels: Sequence[Path], folder: Path) -> list[Path]:
    """The object files of multitarget kernel libraries, each sub-target's together: the dispatching
    wrappers first, then every kernel's code for the first sub-target, for the second, and so on.
    The linker lays code out in the order of its inputs: linked library by library, every page of
    kernel code would hold the code of sub-targets the CPU never runs, resident with the page (and
    the pages the OS maps around it) as soon as the CPU runs the page's one kernel."""
    archiver = archiver_for(compiler)
    groups: dict[str, list[Path]] = {}
    for k, kernel in enumerate(kernels):
        into = folder / str(k)
        into.mkdir(parents=True)
        extracted = subprocess.run([archiver, "x", str(kernel)], cwd=into, capture_output=True, text=True)
        if extracted.returncode != 0:
            raise ToolchainError(f"reading kernel library {kernel.name} failed ({archiver}): "
                                 f"{extracted.stderr.strip() or 'no message'}")
        for member in sorted(into.iterdir()):
            # Halide names them <library>-<sub-target>.o and <library>_wrapper.o.
            key = member.name[len(kernel.name):] if member.name.startswith(kernel.name) else member.name
            groups.setdefault("" if key == "_wrapper.o" else key, []).append(member)
    return [o for key in sorted(groups, key=lambda key: key != "") for o in groups[key]]


def link_delegate(source: str, blocks: Sequence[BundleBlock], target: str, library: Path,
                  cache_dir: Path | None = None, debug_runtime: bool = False) -> Path:
    """Compiles the bundle table and links it with the kernels, the Halide runtime (its debug build
    with `debug_runtime`) and the delegate runtime into `library` (written atomically: a failed link
    leaves nothing behind)."""
    compiler = compiler_for(target)
    library = Path(library)
    library.parent.mkdir(parents=True, exist_ok=True)
    kernels = sorted({a.library for b in blocks for a in b.kernels()})
    runtime = compile_runtime(target, cache_dir, debug=debug_runtime)
    with tempfile.TemporaryDirectory(dir=library.parent, prefix=".tmp-link-") as tmp:
        table = Path(tmp) / "bundle.cc"
        table.write_text(source)
        out = Path(tmp) / library.name
        if len(target_spec(target).halide) > 1:
            kernel_inputs = [str(o) for o in grouped_by_subtarget(compiler, kernels, Path(tmp) / "kernels")]
        else:
            kernel_inputs = [str(k) for k in kernels]
        run_tool([compiler, *_flags(), "-shared", str(table), *map(str, runtime_objects(target, cache_dir)),
              *kernel_inputs, str(runtime), f"-Wl,--version-script={DELEGATE_DIR / 'exports.map'}", *LINK_OPTIONS,
              *SYSTEM_LIBRARIES, "-o", str(out)], "linking the delegate library")
        os.replace(out, library)
    return library


# The JNI library an Android project builds beside the model's library (delegate/android/jni_shim.cc):
# one copy serves every model library an app ships.
JNI_LIBRARY = "libdnnfusion_jni.so"

ANDROID_CMAKE = """\
# Generated by halide_gen/bundle.py: builds {library} for Android with the NDK.
#
#   cmake -S . -B build -DCMAKE_TOOLCHAIN_FILE=$ANDROID_NDK/build/cmake/android.toolchain.cmake \\
#         -DANDROID_ABI=arm64-v8a -DANDROID_PLATFORM=android-{min_sdk} -DCMAKE_BUILD_TYPE=Release
#   cmake --build build        # -> build/{library}
#
# Everything it needs is in this folder: the generated bundle table, the delegate runtime's
# sources, HalideRuntime.h, the Halide kernels (static libraries) and the Halide runtime (an
# object file), all compiled for {halide_target}.
cmake_minimum_required(VERSION 3.18)
project({project} LANGUAGES CXX)

# The runtime's compile and link options, as `fuse` uses them for its own links.
include(runtime/runtime_flags.cmake)
set(CMAKE_CXX_STANDARD ${{DNNFUSION_CXX_STANDARD}})
set(CMAKE_CXX_STANDARD_REQUIRED ON)
add_compile_options(${{DNNFUSION_COMPILE_OPTIONS}})
find_package(Threads REQUIRED)

file(GLOB RUNTIME_SOURCES "${{CMAKE_CURRENT_SOURCE_DIR}}/runtime/src/*.cc")
file(GLOB KERNELS "${{CMAKE_CURRENT_SOURCE_DIR}}/kernels/*.a")
add_library({project} SHARED bundle.cc ${{RUNTIME_SOURCES}} halide_runtime.o)
set_target_properties({project} PROPERTIES OUTPUT_NAME "{output_name}" CXX_VISIBILITY_PRESET hidden)
target_include_directories({project} PRIVATE runtime/include runtime/src include)
target_link_libraries({project} PRIVATE ${{KERNELS}} Threads::Threads ${{CMAKE_DL_LIBS}}
  "-Wl,--version-script=${{CMAKE_CURRENT_SOURCE_DIR}}/runtime/exports.map")
# 16 KB-aligned load segments: Google Play requires them of apps targeting Android 15+, and NDKs
# before r28 align to 4 KB.
target_link_options({project} PRIVATE "-Wl,-z,max-page-size=16384" ${{DNNFUSION_LINK_OPTIONS}})
if(ANDROID)
  # The delegate's messages (and Halide's) go to logcat.
  target_link_libraries({project} PRIVATE log)
  # Java/Kotlin apps reach every model library through this one JNI library
  # (runtime/android/DnnFusionDelegate.java); each model's project builds the same file.
  add_library(dnnfusion_jni SHARED runtime/android/jni_shim.cc)
  set_target_properties(dnnfusion_jni PROPERTIES CXX_VISIBILITY_PRESET hidden)
  target_link_libraries(dnnfusion_jni PRIVATE ${{CMAKE_DL_LIBS}}
    "-Wl,--version-script=${{CMAKE_CURRENT_SOURCE_DIR}}/runtime/android/jni_exports.map")
  target_link_options(dnnfusion_jni PRIVATE "-Wl,-z,max-page-size=16384" ${{DNNFUSION_LINK_OPTIONS}})
endif()
"""


def write_cmake_project(source: str, blocks: Sequence[BundleBlock], target: str, folder: Path, library: str,
                        cache_dir: Path | None = None) -> Path:
    """A self-contained CMake project that builds `library` for `target` with whatever toolchain
    the caller points CMake at (the NDK for Android). Returns its folder."""
    spec = target_spec(target)
    folder = Path(folder)
    (folder / "kernels").mkdir(parents=True, exist_ok=True)
    (folder / "include").mkdir(exist_ok=True)
    (folder / "bundle.cc").write_text(source)
    for lib in sorted({a.library for b in blocks for a in b.kernels()}):
        shutil.copy2(lib, folder / "kernels" / f"{lib.parent.name}-{lib.name}")
    shutil.copy2(compile_runtime(target, cache_dir), folder / "halide_runtime.o")
    shutil.copy2(HALIDE_INCLUDE / "HalideRuntime.h", folder / "include" / "HalideRuntime.h")
    shutil.copytree(DELEGATE_DIR / "include", folder / "runtime" / "include", dirs_exist_ok=True)
    shutil.copytree(DELEGATE_DIR / "src", folder / "runtime" / "src", dirs_exist_ok=True)
    shutil.copytree(DELEGATE_DIR / "android", folder / "runtime" / "android", dirs_exist_ok=True)
    shutil.copy2(DELEGATE_DIR / "exports.map", folder / "runtime" / "exports.map")
    shutil.copy2(DELEGATE_DIR / "runtime_flags.cmake", folder / "runtime" / "runtime_flags.cmake")
    stem = library.removeprefix("lib").removesuffix(".so")
    (folder / "CMakeLists.txt").write_text(ANDROID_CMAKE.format(library=library, project=stem, output_name=stem,
                                                                halide_target=spec.halide[0],
                                                                min_sdk=ANDROID_MIN_SDK))
    return folder


def build_cmake_project(folder: Path, build: Path, cmake_args: Sequence[str]) -> None:
    """Configures and builds a project written by write_cmake_project (a clear error on failure)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ToolchainError("cmake not found (pip install cmake, or apt-get install cmake)")
    run_tool([cmake, "-S", str(folder), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *cmake_args], "cmake configure")
    run_tool([cmake, "--build", str(build), "--parallel", "2"], "cmake build")
