"""The kernel bundle's binary layout, defined once: the enums and structs that the generated table
(halide_gen.bundle) fills in and the delegate runtime (delegate/) reads.

C++ sees these definitions as `delegate/include/dnnfusion/bundle_abi.h`, a header written from this
module (`python -m halide_gen.bundle_abi` rewrites it; tests/test_delegate_runtime.py checks the
committed copy is current). The generated table's rows are built with `initializer`, which orders the
values by the same field list that laid out the struct, so the two cannot drift apart: a renamed,
added or reordered field changes both, and a row that misses or invents a field raises.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable

from .pack import WEIGHT_BLOCKS

HEADER = Path(__file__).resolve().parent.parent / "delegate" / "include" / "dnnfusion" / "bundle_abi.h"

MAX_RANK = 8  # dims a TensorSpec or ArgSpec holds


@dataclass(frozen=True)
class Member:
    """One enumerator: the Python value it stands for, its C++ name, its number and what it means."""

    key: Hashable
    name: str
    value: int
    comment: str = ""


@dataclass(frozen=True)
class Enum:
    """A C++ enum over int32_t; `scoped` makes it an `enum class`. `named`: its keys are the
    strings a user writes (an option's values), numbered from 0: the header also holds them as a
    table, k<name>Names, so that the runtime parses and prints them from this one definition."""

    name: str
    doc: str
    members: tuple[Member, ...]
    scoped: bool = True
    named: bool = False

    def __post_init__(self):
        if self.named and [m.value for m in self.members] != list(range(len(self.members))):
            raise ValueError(f"{self.name}: a named enum's values are 0, 1, ... in order")

    def member(self, key: Hashable) -> Member:
        """The member that stands for `key`; KeyError if none does."""
        for m in self.members:
            if m.key == key:
                return m
        raise KeyError(f"{self.name} has no member for {key!r}")

    def code(self, key: Hashable) -> str:
        """The C++ expression for the member that stands for `key`."""
        name = self.member(key).name
        return f"{self.name}::{name}" if self.scoped else name

    def value(self, key: Hashable) -> int:
        """The number stored for `key`."""
        return self.member(key).value


@dataclass(frozen=True)
class Field:
    """One struct member: its name, C++ declaration type and what it holds."""

    name: str
    ctype: str
    comment: str = ""


@dataclass(frozen=True)
class Struct:
    """A plain C++ struct the bundle table is an array of."""

    name: str
    doc: str
    fields: tuple[Field, ...]


PACK = Enum("Pack", "How a constant argument is laid out for the kernel (halide_gen/pack.py, delegate/src/pack.cc).", (
    Member(None, "kNone", 0, "as stored in the model"),
    Member("pad_channels", "kPadChannels", 3, "pad the innermost (channel) axis"),
    Member("o_blocked", "kOBlocked", 4, "conv / FC weights [O, ...] -> [O padded / tile, ..., tile]"),
    Member("dot4", "kDot4", 5, "dot-product weights [O, ..., I] -> [..., I / 4, O padded, 4]"),
    Member("channel_sums", "kChannelSums", 6, "int8 [O, ...] -> int32 [O padded]: each output channel's sum"),
    Member("dot4_rows", "kDot4Rows", 7, "CONV_2D [O, kh, kw, I] -> [kh, ceil(kw * I / 4), O padded, 4], zero-padded"),
    Member("tap_sums", "kTapSums", 8, "int8 depthwise [1, kh, kw, C] -> int32 [C padded]: each channel's sum; "
                                      "refuses -128 (its kernels add two products in int16)"),
    Member("dot4_blocked", "kDot4Blocked", 9, "dot-product weights [O, ..., I] -> [O padded / tile, ..., I / 4, tile, 4]"),
    Member("o_last_blocked", "kOLastBlocked", 10, "CONV_3D weights [..., O] -> [O padded / tile, ..., tile]"),
    Member("o_before_last_blocked", "kOBeforeLastBlocked", 11,
           "CONV_3D_TRANSPOSE weights [..., O, I] -> [O padded / tile, ..., I, tile]"),
    *(Member(f"block_sums{block}", f"kBlockSums{block}", code,
             f"int8 [O, I] -> int32 [O padded / tile, I / {block}, tile]: sums per block of {block} inputs")
      for code, block in enumerate(WEIGHT_BLOCKS, start=12)),
    Member("o_blocked_widened", "kOBlockedWidened", 16, "fp16 [O, ...] -> float32 [O padded / tile, ..., tile]"),
))

ARG_SOURCE = Enum("ArgSource", "Where a kernel argument's data comes from (ArgSpec::source).", (
    Member("computed", "kComputed", 0, "a partition input or a block's output: bound at every Invoke"),
    Member("constant", "kConstant", 1, "a constant of the model: checked at claim, packed once at Prepare"),
    Member("decoded", "kDecoded", 2, "decoded (DEQUANTIZE, DENSIFY: run by the delegate) from the constant "
                                     "ArgSpec::stored before the blocks run: packed once, at the first Invoke"),
))

GPU_API = Enum("GpuApi", "Where a bundle's kernels run (Bundle::gpu_api).", (
    Member(None, "kNoGpu", 0, "on the CPU"),
    Member("opencl", "kOpenCl", 1),
    Member("vulkan", "kVulkan", 2),
), scoped=False)

CLAIM_POLICY = Enum("ClaimPolicy", "Which blocks the delegate claims (the `claim` option; Bundle::default_claim).", (
    Member("profitable", "kProfitable", 0, "only blocks measured (or estimated) faster than TFLite on the same nodes"),
    Member("all", "kAll", 1, "every block the bundle has a kernel for"),
    Member("none", "kNone", 2, "nothing: load the library, report what would match, run stock TFLite"),
), named=True)

# TfLiteType codes by schema type name. TFLite's enum is declared in tflite_abi.h; the generated
# header asserts each number against it.
TFLITE_TYPES = Enum("TfLiteType", "TFLite's tensor types (declared in tflite_abi.h).", (
    Member("FLOAT32", "kTfLiteFloat32", 1), Member("INT32", "kTfLiteInt32", 2), Member("UINT8", "kTfLiteUInt8", 3),
    Member("INT64", "kTfLiteInt64", 4), Member("STRING", "kTfLiteString", 5), Member("BOOL", "kTfLiteBool", 6),
    Member("INT16", "kTfLiteInt16", 7), Member("COMPLEX64", "kTfLiteComplex64", 8), Member("INT8", "kTfLiteInt8", 9),
    Member("FLOAT16", "kTfLiteFloat16", 10), Member("FLOAT64", "kTfLiteFloat64", 11), Member("INT4", "kTfLiteInt4", 18),
), scoped=False)

TENSOR_SPEC = Struct("TensorSpec", "A tensor as the model was compiled (TFLite order, outermost dimension first).", (
    Field("index", "int32_t", "in the subgraph"),
    Field("type", "int32_t", "TfLiteType"),
    Field("rank", "int32_t"),
    Field("dims", "int32_t[kMaxRank]"),
    Field("batch_axis", "int32_t", "the axis carrying the batch where a block takes it in windows (-1: none)"),
    Field("sequence_axis", "int32_t", "the axis carrying the sequence where a block takes it in windows (-1: none)"),
))

NODE_SPEC = Struct("NodeSpec", "A graph node a block replaces.", (
    Field("index", "int32_t", "in the subgraph"),
    Field("builtin_code", "int32_t"),
    Field("first_io", "int32_t", "its inputs, then outputs, in Bundle::node_tensors (-1: omitted optional input)"),
    Field("n_inputs", "int32_t"),
    Field("n_outputs", "int32_t"),
))

ARG_SPEC = Struct("ArgSpec", "One kernel argument: the tensor it reads and the shape the kernel sees after packing.", (
    Field("tensor", "int32_t", "index in the subgraph"),
    Field("source", "ArgSource"),
    Field("stored", "int32_t", "kDecoded: the stored constant it is decoded from (else -1)"),
    Field("pack", "Pack"),
    Field("half", "int32_t", "1: a float32 constant the kernel reads in half precision, converted once after packing"),
    Field("rank", "int32_t"),
    Field("dims", "int32_t[kMaxRank]", "after packing, TFLite order"),
    Field("first_index_bound", "int32_t", "slice of Bundle::index_bounds: indices a GPU kernel reads unchecked, each "
                                          "innermost position k < bound[k % n]; the partition checks them first"),
    Field("n_index_bounds", "int32_t", "0: no check"),
    Field("index_op", "const char*", "the op reading them, for the message (\"gather\")"),
))

SCRATCH_SPEC = Struct("ScratchSpec", "A buffer a GPU kernel computes into for its own later stages (an extra output "
                                     "after the block's): the partition allocates it once.", (
    Field("type", "int32_t", "TfLiteType"),
    Field("rank", "int32_t"),
    Field("dims", "int32_t[kMaxRank]", "TFLite order"),
))

BLOCK_SPEC = Struct("BlockSpec", "One fused block and its kernel.", (
    Field("name", "const char*", "as in plan.json and report.md"),
    Field("signature", "const char*", "the kernel's entry point, named by its identity (blocks of one identity share it)"),
    Field("kernel", "KernelEntry", "Halide's `<name>_argv`: inputs, then outputs, as halide_buffer_t*"),
    Field("profitable", "int32_t", "measured (or estimated) faster than TFLite on the same nodes"),
    Field("first_node", "int32_t", "slice of Bundle::nodes"),
    Field("n_nodes", "int32_t"),
    Field("first_arg", "int32_t", "slice of Bundle::args"),
    Field("n_args", "int32_t"),
    Field("first_output", "int32_t", "slice of Bundle::outputs (tensor indices)"),
    Field("n_outputs", "int32_t"),
    Field("group", "int32_t", "nonzero: claimed with the other blocks of its group or not at all "
                              "(MediaPipe argmax indices)"),
    Field("first_scratch", "int32_t", "slice of Bundle::scratch: the kernel's arguments after its outputs"),
    Field("n_scratch", "int32_t"),
    Field("in_place_kernel", "KernelEntry", "the kernel's in-place form (nullptr: none), run instead where every "
                                            "pair of in_place shares its memory: it writes only the updates"),
    Field("first_in_place", "int32_t", "slice of GraphSpec::in_place, in pairs: an argument's position among "
                                       "the block's, then the output's it updates (a KV cache passed in and out)"),
    Field("n_in_place", "int32_t", "pairs"),
    Field("windows", "int32_t", "bit d set: may run on windows of the compiled steps where the model is resized "
                                "along direction d (0: the batch, 1: the sequence), taking each tensor that "
                                "carries it (TensorSpec::batch_axis, sequence_axis) in windows, the others whole"),
))

GRAPH_SPEC = Struct("GraphSpec", "One fused subgraph's table: the blocks the delegate may claim in it.", (
    Field("subgraph", "int32_t", "index in the model"),
    Field("name", "const char*", "its signature key, name or subgraph<N>, for messages"),
    Field("n_tensors", "int32_t", "tensors in the subgraph"),
    Field("n_graph_nodes", "int32_t", "nodes in the subgraph"),
    Field("graph_codes", "const int32_t*", "their builtin codes, in order"),
    Field("tensors", "const TensorSpec*", "every tensor a block touches, sorted by index"),
    Field("n_tensor_specs", "int32_t"),
    Field("nodes", "const NodeSpec*"),
    Field("node_tensors", "const int32_t*"),
    Field("args", "const ArgSpec*"),
    Field("outputs", "const int32_t*"),
    Field("blocks", "const BlockSpec*"),
    Field("n_blocks", "int32_t"),
    Field("scratch", "const ScratchSpec*", "GPU kernels' scratch buffers (BlockSpec::first_scratch)"),
    Field("index_bounds", "const int32_t*", "ArgSpec::first_index_bound"),
    Field("in_place", "const int32_t*", "BlockSpec::first_in_place"),
))

BUNDLE = Struct("Bundle", "The whole table of one delegate library.", (
    Field("model", "const char*", "the model's file name, for messages"),
    Field("target", "const char*", "halide_gen.targets name"),
    Field("fingerprint", "const char*", "structure hash, also stored in the fused model's metadata"),
    Field("channel_tile", "int32_t", "padding multiple of packed constants"),
    Field("graphs", "const GraphSpec*", "one per fused subgraph; any two the delegate could mistake for each "
                                        "other compute the same (halide_gen.bundle.indistinguishable)"),
    Field("n_graphs", "int32_t"),
    Field("default_claim", "int32_t", "ClaimPolicy when the options name none (`fuse --measure` picks it)"),
    Field("default_claim_threaded", "int32_t", "the same where the interpreter runs more than one thread"),
    Field("allow_dynamic_tensors", "int32_t", "1: the model has custom ops or tensors sized only as it runs (plugin.cc)"),
    Field("gpu_api", "int32_t", "GpuApi"),
    Field("half_precision", "int32_t", "1: float tensors stored as fp16 (--gpu-precision or --cpu-precision fp16)"),
    Field("vulkan_alloc_config", "const char*", "HL_VK_ALLOC_CONFIG unless the environment sets one"),
    Field("needs_dot_product", "int32_t", "1: CPU kernels use ARMv8.2 SDOT (declined where HWCAP_ASIMDDP is unset)"),
    Field("needs_half_arithmetic", "int32_t", "1: CPU kernels compute in fp16 (declined where HWCAP_FPHP / "
                                              "HWCAP_ASIMDHP are unset)"),
    Field("cpu_features", "const uint64_t*", "a native build's Halide target features, bit k of word k / 64 for "
                                            "halide_target_feature_t k (declined where the CPU lacks one)"),
    Field("n_cpu_feature_words", "int32_t", "0: no features to check"),
))

ENUMS = (PACK, ARG_SOURCE, GPU_API, CLAIM_POLICY)
STRUCTS = (TENSOR_SPEC, NODE_SPEC, ARG_SPEC, SCRATCH_SPEC, BLOCK_SPEC, GRAPH_SPEC, BUNDLE)


def initializer(struct: Struct, **values: Any) -> str:
    """A brace initializer for `struct` from its fields by name, in the struct's order; raises
    KeyError naming any field missing or unknown."""
    names = [f.name for f in struct.fields]
    missing, unknown = [n for n in names if n not in values], [n for n in values if n not in names]
    if missing or unknown:
        raise KeyError(f"{struct.name}: missing {missing}, unknown {unknown}")
    return "{" + ", ".join(str(values[n]) for n in names) + "}"


def _comment(text: str) -> str:
    return f"  // {text}" if text else ""


def _enum(enum: Enum) -> list[str]:
    keyword = "enum class" if enum.scoped else "enum"
    lines = [f"// {enum.doc}", f"{keyword} {enum.name} : int32_t {{"]
    lines += [f"  {m.name} = {m.value},{_comment(m.comment)}" for m in enum.members]
    lines += ["};", ""]
    if enum.named:
        names = ", ".join(f'"{m.key}"' for m in enum.members)
        lines += [f"// {enum.name}'s members as written, by number.",
                  f"constexpr const char* k{enum.name}Names[] = {{{names}}};",
                  f"constexpr int32_t k{enum.name}Count = {len(enum.members)};", ""]
    return lines


def _struct(struct: Struct) -> list[str]:
    lines = [f"// {struct.doc}", f"struct {struct.name} {{"]
    for f in struct.fields:
        ctype, _, extent = f.ctype.partition("[")
        lines.append(f"  {ctype} {f.name}{'[' + extent if extent else ''};{_comment(f.comment)}")
    return lines + ["};", ""]


def header() -> str:
    """The text of delegate/include/dnnfusion/bundle_abi.h."""
    lines = [
        "// Generated by halide_gen/bundle_abi.py (python -m halide_gen.bundle_abi). Do not edit: change the",
        "// Python definitions, which also lay out the generated tables' initializers.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        '#include "dnnfusion/tflite_abi.h"',
        "",
        "namespace dnnfusion {",
        "",
        f"constexpr int kMaxRank = {MAX_RANK};",
        "",
        "// The bundle stores tensor types as TfLiteType numbers.",
        *[f'static_assert({m.name} == {m.value}, "TfLiteType {m.key}");' for m in TFLITE_TYPES.members],
        "",
        "typedef int (*KernelEntry)(void** args);",
        "",
    ]
    for enum in ENUMS:
        lines += _enum(enum)
    for struct in STRUCTS:
        lines += _struct(struct)
    return "\n".join([*lines, "}  // namespace dnnfusion", ""])


if __name__ == "__main__":
    HEADER.write_text(header())
    print(f"wrote {HEADER}", file=sys.stderr)
