"""A standalone C++ runner for one AOT kernel: the way tests run generated code outside Python —
natively, under qemu-aarch64, or on a GPU through OpenCL / Vulkan.

The runner reads each kernel argument from a raw file (TFLite row-major bytes, which is Halide's
dense layout with the innermost dimension first), calls the kernel through Halide's argv entry
point, copies outputs back from the device if there is one, and writes each output raw.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .aot import KernelArtifact, compile_runtime
from .bundle import HALIDE_INCLUDE
from .pack import half_saturated
from .targets import feature_word_count, feature_words, target_spec
from .toolchain import compiler_for

_TYPES = {
    "FLOAT32": ("halide_type_float", 32, np.float32), "FLOAT16": ("halide_type_float", 16, np.float16),
    "INT8": ("halide_type_int", 8, np.int8), "UINT8": ("halide_type_uint", 8, np.uint8),
    "INT16": ("halide_type_int", 16, np.int16), "INT32": ("halide_type_int", 32, np.int32),
    "INT64": ("halide_type_int", 64, np.int64), "BOOL": ("halide_type_uint", 8, np.uint8),
}

def _buffer(var: str, desc: dict) -> str:
    code, bits, _ = _TYPES[desc["type"]]
    sizes = ", ".join(str(d) for d in reversed(desc["shape"]))
    return f"  Halide::Runtime::Buffer<void> {var}(halide_type_t({code}, {bits}), std::vector<int>{{{sizes}}});"


def runner_source(artifact: KernelArtifact, features: Sequence[int] | None = None) -> str:
    """C++ source of a runner for `artifact`: `runner IN... OUT...` (paths to raw files). With
    `features` (Halide target features), a multitarget kernel's dispatch may take only a build that
    needs no others, and the runner fails (exit 3) unless it took the build of exactly these: each
    build can then be run on a CPU that has more."""
    n_in, n_out = len(artifact.arguments), len(artifact.outputs)
    lines = [
        "#include <cstdio>",
        "#include <vector>",
        '#include "HalideBuffer.h"',
        f'#include "{artifact.header.name}"',
        "",
    ]
    if features is not None:
        words = feature_words(features) or [0] * feature_word_count()
        allowed = ", ".join(f"0x{w:x}ULL" for w in words)
        lines += [
            f"static const uint64_t allowed[{len(words)}] = {{{allowed}}};",
            f"static uint64_t granted[{len(words)}];  // the features of the build the dispatch took (none: the baseline)",
            "static int only_allowed(int count, const uint64_t *features) {",
            "  for (int k = 0; k < count; k++) if (features[k] & ~allowed[k]) return 0;",
            "  int ok = halide_default_can_use_target_features(count, features);",
            "  for (int k = 0; ok && k < count; k++) granted[k] = features[k];",
            "  return ok;",
            "}",
            "static const int installed = (halide_set_custom_can_use_target_features(only_allowed), 0);",
            "static bool took_the_allowed_build() {",
            f"  for (int k = 0; k < {len(words)}; k++) if (granted[k] != allowed[k]) return false;",
            "  return true;",
            "}",
            "",
        ]
    lines += [
        "static bool read_raw(const char *path, Halide::Runtime::Buffer<void> &b) {",
        '  FILE *f = std::fopen(path, "rb");',
        "  if (!f) return false;",
        "  size_t n = std::fread(b.data(), 1, b.size_in_bytes(), f);",
        "  std::fclose(f);",
        "  return n == b.size_in_bytes();",
        "}",
        "",
        "static bool write_raw(const char *path, Halide::Runtime::Buffer<void> &b) {",
        '  FILE *f = std::fopen(path, "wb");',
        "  if (!f) return false;",
        "  size_t n = std::fwrite(b.data(), 1, b.size_in_bytes(), f);",
        "  std::fclose(f);",
        "  return n == b.size_in_bytes();",
        "}",
        "",
        "int main(int argc, char **argv) {",
        f"  if (argc != {1 + n_in + n_out}) {{ std::fprintf(stderr, \"usage: runner IN*{n_in} OUT*{n_out}\\n\"); return 2; }}",
    ]
    for k, desc in enumerate(artifact.arguments):
        lines.append(_buffer(f"in{k}", desc))
        lines.append(f'  if (!read_raw(argv[{1 + k}], in{k})) {{ std::fprintf(stderr, "cannot read input {k}\\n"); return 2; }}')
        lines.append(f"  in{k}.set_host_dirty();")
    for k, desc in enumerate(artifact.outputs):
        lines.append(_buffer(f"out{k}", desc))
    for k, desc in enumerate(artifact.scratch):  # a GPU kernel's scratch: its memory, never read here
        lines.append(_buffer(f"scratch{k}", desc))
    buffers = ([f"in{k}.raw_buffer()" for k in range(n_in)] + [f"out{k}.raw_buffer()" for k in range(n_out)]
               + [f"scratch{k}.raw_buffer()" for k in range(len(artifact.scratch))])
    lines.append(f"  void *args[] = {{{', '.join(buffers)}}};")
    lines.append(f"  int err = {artifact.function}_argv(args);")
    lines.append('  if (err) { std::fprintf(stderr, "kernel failed: %d\\n", err); return 1; }')
    if features is not None:
        lines.append('  if (!took_the_allowed_build()) { std::fprintf(stderr, "the dispatch took another build\\n"); return 3; }')
    for k in range(n_out):
        lines.append(f"  out{k}.copy_to_host();")
        lines.append(f'  if (!write_raw(argv[{1 + n_in + k}], out{k})) return 2;')
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


@dataclass
class Runner:
    """A built runner executable and how to launch it."""

    path: Path
    artifact: KernelArtifact
    launcher: list[str]  # e.g. ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"] or []

    def __call__(self, inputs: Sequence[np.ndarray], env: dict[str, str] | None = None) -> list[np.ndarray]:
        """Runs on arrays (one per kernel argument) and returns the outputs."""
        with tempfile.TemporaryDirectory() as tmp:
            ins, outs = [], []
            for k, (desc, arr) in enumerate(zip(self.artifact.arguments, inputs)):
                p = Path(tmp) / f"in{k}.bin"
                wanted = _TYPES[desc["type"]][2]
                data = half_saturated(arr) if wanted == np.float16 else np.asarray(arr).astype(wanted)
                p.write_bytes(np.ascontiguousarray(data).tobytes())
                ins.append(str(p))
            outs = [str(Path(tmp) / f"out{k}.bin") for k in range(len(self.artifact.outputs))]
            proc = subprocess.run([*self.launcher, str(self.path), *ins, *outs], capture_output=True, text=True,
                                  env={**os.environ, **(env or {})}, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"runner failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
            results = []
            for desc, p in zip(self.artifact.outputs, outs):
                arr = np.frombuffer(Path(p).read_bytes(), _TYPES[desc["type"]][2]).reshape(desc["shape"])
                results.append(arr.astype(np.bool_) if desc["type"] == "BOOL" else arr.copy())
            return results


def build_runner(artifact: KernelArtifact, target: str, out_dir: Path, features: Sequence[int] | None = None) -> Runner:
    """Compiles and links a runner for an AOT kernel (g++ for x86, aarch64-linux-gnu-g++ for ARM);
    `features` as runner_source takes them."""
    compiler = compiler_for(target)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = artifact.function + ("" if features is None else "_" + "_".join(map(str, sorted(features))))
    source = out_dir / f"{name}_runner.cpp"
    text = runner_source(artifact, features)
    exe = out_dir / f"{name}_runner"
    runtime = compile_runtime(target, artifact.library.parent.parent)
    cmd = [compiler, "-std=c++17", "-O1", f"-I{HALIDE_INCLUDE}", f"-I{artifact.header.parent}", str(source),
           str(artifact.library), str(runtime), "-o", str(exe), "-lpthread", "-ldl"]
    if not _up_to_date(exe, source, text, [artifact.library, runtime]):
        source.write_text(text)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            exe.unlink(missing_ok=True)
            raise RuntimeError(f"building the runner failed: {proc.stderr.strip()[-2000:]}")
    return Runner(exe, artifact, list(target_spec(target).toolchain.launcher))


def _up_to_date(exe: Path, source: Path, text: str, inputs: list[Path]) -> bool:
    """Whether `exe` was linked from this source text after every input last changed (as make
    decides): a kernel run on several inputs builds its runner once."""
    if not exe.exists() or not source.exists() or source.read_text() != text:
        return False
    built = exe.stat().st_mtime_ns
    return all(p.stat().st_mtime_ns <= built for p in (source, *inputs))
