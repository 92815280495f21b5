"""What a GPU bundle asks of the device per invoke: kernel launches, device allocations, copies and
bytes copied, per block and per model, read from Halide's debug runtime trace. The counts do not
depend on the device (PoCL and lavapipe give the ones a phone's GPU would see) or on the host.

    python bench/gpu_counts.py [MODEL ...] [--quick] [--api opencl vulkan] [--invokes 3] [--json]

MODEL defaults to the GPU test models and the reference models (bench/zoo.py); `--quick` takes the
test models alone (minutes under PoCL and lavapipe, where the reference set takes about an hour).

Each model is fused for host-<api> with `--debug-runtime`, checked against LiteRT's reference
(`tflite_tools run`: an error outside its tolerance shows as inf) and invoked `--invokes` times in a
fresh process with `claim:all` and `log_level:verbose`; the delegate names each block before its kernel
runs (delegate/src/partition.cc), so the trace splits into blocks. The last invoke is the steady
state: weights were uploaded by the first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ICDS = {"opencl": ("OCL_ICD_VENDORS", Path("/etc/OpenCL/vendors/pocl.icd"), "pocl-opencl-icd"),
        "vulkan": ("VK_ICD_FILENAMES", Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"), "mesa-vulkan-drivers")}

# The debug runtime's line for each event, per API (Halide's runtime/opencl.cpp and vulkan.cpp).
# Vulkan's device_malloc also runs for buffers that have memory ("using existing buffer"): what
# reaches the driver is vkCreateBuffer (a region of the runtime's pooled blocks, or a staging
# buffer). Only OpenCL's trace gives a copy's size.
EVENTS = {
    "opencl": {"launches": ("CL: halide_opencl_run (",), "allocations": ("CL: halide_opencl_device_malloc (",),
               "copies": ("CL: halide_opencl_buffer_copy (",)},
    "vulkan": {"launches": ("halide_vulkan_run (",), "allocations": ("vkCreateBuffer: Created buffer",),
               "copies": ("copying into device region", "copying from device region")},
}
COPIED = re.compile(r"from (?:host to device|device to host).*?(\d+) bytes")
BLOCK = re.compile(r"^dnnfusion: verbose: block (\S+)$")

RUNNER = """
import sys
from tflite_tools import runtime
d = runtime.load_delegate(sys.argv[2], options={"claim": "all", "log_level": "verbose"})
interp = runtime.make_interpreter(sys.argv[1], "xnnpack", 1, delegates=[d])
inputs = runtime.random_inputs(interp)
for k in range(int(sys.argv[3])):
    print(f"=== invoke {k}", file=sys.stderr, flush=True)
    runtime.run(interp, inputs)
print("=== done", file=sys.stderr, flush=True)
"""


@dataclass
class Counts:
    """Device work of one invoke (or one block of it)."""

    launches: int = 0
    allocations: int = 0
    copies: int = 0
    bytes_copied: int = 0

    def add(self, other: "Counts") -> None:
        """Adds `other` into these counts."""
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass
class Invoke:
    """One invoke's counts, whole and per block (in the order the blocks ran)."""

    total: Counts = field(default_factory=Counts)
    blocks: dict[str, Counts] = field(default_factory=dict)


def parse(trace: str, api: str) -> list[Invoke]:
    """The invokes of a RUNNER trace. Events before an invoke's first block (weights uploaded at the
    partition's start) count for the invoke, not for a block."""
    events = EVENTS[api]
    invokes: list[Invoke] = []
    current: Counts | None = None
    for line in trace.split("=== done")[0].splitlines():
        if line.startswith("=== invoke "):
            invokes.append(Invoke())
            current = None
            continue
        if not invokes:
            continue
        match = BLOCK.match(line)
        if match:
            current = invokes[-1].blocks.setdefault(match.group(1), Counts())
            continue
        step = Counts()
        for name, markers in events.items():
            if any(m in line for m in markers):
                setattr(step, name, 1)
        copied = COPIED.search(line)
        if copied:
            step.bytes_copied = int(copied.group(1))
        invokes[-1].total.add(step)
        if current is not None:
            current.add(step)
    return invokes


def device_env(api: str) -> dict[str, str]:
    """This process's environment, pointed at the API's CPU implementation (PoCL, lavapipe);
    FileNotFoundError naming the Debian package when it is missing."""
    key, icd, package = ICDS[api]
    if not icd.exists():
        raise FileNotFoundError(f"{icd} is missing: apt-get install {package}")
    env = {k: v for k, v in os.environ.items() if k != "HL_VK_ALLOC_CONFIG"}
    return {**env, key: str(icd.parent if api == "opencl" else icd), "PYTHONPATH": str(REPO)}


def trace(model: Path, library: Path, api: str, invokes: int = 3) -> list[Invoke]:
    """Runs a fused model with its debug-runtime GPU delegate in a fresh process (the ICD loaders
    read their environment once per process) and returns its invokes' counts."""
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(model), str(library), str(invokes)],
                          capture_output=True, text=True, env=device_env(api), timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{model} on {api}: {proc.stderr[-2000:]}")
    return parse(proc.stderr, api)


def matches_litert(model: Path, library: Path, api: str) -> float:
    """The largest relative error of the delegate's outputs (claim:all) against LiteRT's reference
    (`tflite_tools run`), or inf when it is outside the tolerance: counts of a wrong kernel mean nothing."""
    proc = subprocess.run([sys.executable, "-m", "tflite_tools", "run", str(model), "--delegate", str(library),
                           "--option", "claim=all", "--option", "log_level=error", "--json"],
                          capture_output=True, text=True, env=device_env(api), timeout=1800)
    if proc.returncode != 0:
        return float("inf")
    report = json.loads(proc.stdout)
    return max(o["max_rel"] for o in report["outputs"]) if report["ok"] else float("inf")


def measure(model: Path, api: str, out: Path, invokes: int = 3, cache_dir: Path | None = None) -> dict:
    """One row: the model fused for host-<api> with the debug runtime, its first and last invoke,
    and its outputs' error against LiteRT."""
    from tflite_tools.fuse import fuse

    result = fuse(model, out / model.stem / api, target=f"host-{api}", debug_runtime=True, cache_dir=cache_dir)
    runs = trace(result.model, result.library, api, invokes)
    return {"model": model.stem, "api": api, "blocks": sum(1 for k in result.kernels if k.kernel),
            "first": asdict(runs[0].total), "steady": asdict(runs[-1].total),
            "per_block": {name: asdict(c) for name, c in runs[-1].blocks.items()},
            "max_rel": matches_litert(result.model, result.library, api)}


def table(rows: list[dict]) -> str:
    """Markdown: per model and API, the steady-state invoke's counts against the block count."""
    lines = ["| model | API | blocks | launches / invoke | launches / block | device allocations / invoke | "
             "copies / invoke | bytes copied / invoke (OpenCL) | first invoke: allocations, copies | "
             "max rel. error vs LiteRT |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, f = r["steady"], r["first"]
        copied = f"{s['bytes_copied']:,}" if r["api"] == "opencl" else "-"
        lines.append(f"| {r['model']} | {r['api']} | {r['blocks']} | {s['launches']} | "
                     f"{s['launches'] / max(1, r['blocks']):.2f} | {s['allocations']} | {s['copies']} | {copied} | "
                     f"{f['allocations']}, {f['copies']} | {r['max_rel']:.2g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: fuse, trace, print the table (or JSON)."""
    from zoo import GPU_TEST_MODELS, models_from_tests, reference_models

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path,
                        help="default: zoo.GPU_TEST_MODELS and the reference models")
    parser.add_argument("--quick", action="store_true", help="without MODEL: the GPU test models only")
    parser.add_argument("--api", nargs="+", default=["opencl", "vulkan"], choices=sorted(EVENTS))
    parser.add_argument("--invokes", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "gpu_counts")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    models = args.models or [*models_from_tests(GPU_TEST_MODELS), *([] if args.quick else reference_models())]
    rows = []
    for model in models:
        for api in args.api:
            rows.append(measure(model, api, args.out, args.invokes))
            print(f"{model.stem} {api}: {rows[-1]['steady']}", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
