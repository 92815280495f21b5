"""The whole benchmark set in one command: regenerates bench/RESULTS.md's benchmark section and the
charts in bench/charts/.

    python bench/run.py [--runs 100] [--tvm-python /path/to/tvm/venv/bin/python] [MODEL ...]

Per reference model (bench/zoo.py: ../shared/models when present):
- `fuse` compile time from an empty kernel cache (cold) and again with it warm;
- `fuse --measure` (block timings cached), whose claims make the "profitable" contender;
- latency at one thread, interleaved in one process (tflite_tools.bench): LiteRT + XNNPACK, LiteRT
  builtin, our delegate claiming every block and only the profitable ones — median, min, max and
  the ratio to XNNPACK, taking turns of 10 invokes (warm, as an app running one model) and again
  one invoke per turn (cold: each after another model's); then at two threads, each contender in a
  process of its own (tflite_tools.bench.time_contenders), reported apart (a 2-core machine makes
  them noisy). 100 invokes per contender by default, so 10 turns: with 30 (3 turns) a median
  followed whichever turn a neighbour's load fell in (bert_small read 0.89x-1.00x across runs of the
  same code on a shared 2-core host);
- peak resident memory per contender (a fresh process each) and the planned activation bytes;
- fusion: TFLite ops, our kernels, TVM relax's fused kernels (bench/tvm_fusion.py);
- TVM latency, untuned, one thread (bench/tvm_latency.py), when --tvm-python is given;
- the ARM64 measure (bench/arm_count.py): aarch64 instructions, memory accesses and estimated cycles per
  invoke on qemu's cortex-a76, XNNPACK against the model fused for arm64-linux, when qemu-user and the cross
  compiler are here (cycles where LLVM 17 or later is).

MetaSchedule tuning is not run: in apache-tvm 0.27.0.post1 `relax.transform.MetaScheduleTuneIRMod`
(64 trials, gpt2_small, after the same legalize/fuse passes) crashes the process with a segfault in
`tvm::ffi::ToJSONGraph` as tuning starts (2026-11-30), so the TVM figures are untuned.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

BEGIN, END = "<!-- bench/run.py: begin -->", "<!-- bench/run.py: end -->"
CONTENDERS = ("xnnpack", "builtin", "dnnfusion-all", "dnnfusion-profitable")


def environment() -> dict[str, str]:
    """The machine and versions the figures come from."""
    import numpy
    from importlib.metadata import PackageNotFoundError, version

    from tflite_tools.bench import host_cpu

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "?"

    return {"date": datetime.date.today().isoformat(), "cpu": host_cpu(), "cores": str(os.cpu_count()),
            "python": platform.python_version(), "ai-edge-litert": installed("ai-edge-litert"),
            "halide": installed("halide"), "numpy": numpy.__version__}


def _tvm(python: str | None, script: str, *args: str) -> dict:
    if not python:
        return {}
    proc = subprocess.run([python, str(REPO / "bench" / script), *args], capture_output=True, text=True,
                          env={**os.environ, "TVM_NUM_THREADS": "1"}, timeout=3600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": proc.stderr.strip()[-300:]}


def measure_model(model: Path, out: Path, runs: int, tvm_python: str | None) -> dict:
    """Every figure for one model."""
    import numpy as np

    from tflite_tools import runtime
    from tflite_tools.bench import benchmark, measure_peak_memory, ratios
    from tflite_tools.fuse import fuse

    row: dict = {"model": model.stem}
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        fuse(model, out / "cold", cache_dir=Path(cache))
        row["fuse_cold_s"] = time.perf_counter() - start
        start = time.perf_counter()
        fuse(model, out / "cold", cache_dir=Path(cache))
        row["fuse_warm_s"] = time.perf_counter() - start
    result = fuse(model, out / "measured", measure=True)
    plan = json.loads(result.plan_json.read_text())
    row.update(ops=plan["ops"], kernels=sum(1 for k in result.kernels if k.kernel), blocks=len(result.kernels),
               profitable=sum(k.profitable for k in result.kernels),
               activations_before=plan["peak_bytes_before"], activations_after=plan["peak_bytes_after"])
    for key, threads, cold in (("t1", 1, False), ("t1_cold", 1, True), ("t2", 2, False)):
        timings = benchmark(str(result.model), str(result.library), threads, runs, warmup=3, cold=cold)
        if key == "t1":
            measure_peak_memory(timings, str(result.model), str(result.library), 1)
        rel = ratios(timings)
        row[key] = {t.name: {"median_ms": t.median / 1e3, "min_ms": min(t.runs_us) / 1e3,
                             "max_ms": max(t.runs_us) / 1e3, "ratio": rel[t.name],
                             "peak_mib": (t.peak_memory_kib or 0) / 1024} for t in timings}
    row["tvm_kernels"] = _tvm(tvm_python, "tvm_fusion.py", str(model)).get("fused_functions")
    inputs = []
    interp = runtime.make_interpreter(model)
    for k, array in enumerate(runtime.random_inputs(interp)):
        inputs.append(str(out / f"in{k}.npy"))
        np.save(inputs[-1], array)
    row["tvm"] = _tvm(tvm_python, "tvm_latency.py", str(model), *inputs)
    row["arm64"] = _arm64(model, out / "arm64")
    return row


def _arm64(model: Path, work: Path) -> dict:
    """The ARM64 counts (bench/arm_count.py), or why there are none."""
    import shutil

    import arm_count

    if not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")):
        return {"error": "qemu-user or g++-aarch64-linux-gnu not installed"}
    from arm_cycles import Unavailable, llvm_tool

    try:
        llvm_tool("llvm-mca")
        cycles = True
    except Unavailable:
        cycles = False  # instructions and accesses only
    try:
        return arm_count.model_counts(model, "cortex-a76", work, invokes=3, cycles=cycles)
    except Exception as exc:  # a missing rootfs or a failed emulated run: the rest of the report stands
        return {"error": str(exc).splitlines()[0][:200]}


def _ms(entry: dict) -> str:
    return f"{entry['median_ms']:.2f} ({entry['min_ms']:.2f}-{entry['max_ms']:.2f})"


def format_results(rows: list[dict], env: dict[str, str], command: str) -> str:
    """The Markdown section for RESULTS.md."""
    lines = [BEGIN, "## Benchmarks: the whole set (bench/run.py)", "",
             f"Command: `{command}`. Machine: {env['cpu']}, {env['cores']} cores. Versions: Python {env['python']}, "
             f"ai-edge-litert {env['ai-edge-litert']}, halide {env['halide']}, numpy {env['numpy']}. Date: {env['date']}.",
             "", "Latency at one thread, ms: median (min-max) over interleaved runs in one process, in turns of 10 "
             "invokes after one untimed (warm, as an app running one model sees); the ratio is to LiteRT + XNNPACK's "
             "median (< 1: faster). Cold: one invoke per turn, each after another contender's. TVM: relax, untuned, "
             "one core.", "",
             "| model | XNNPACK | builtin | ours, all blocks | ours, profitable blocks | cold: XNNPACK, ours all | "
             "TVM untuned |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["t1"]
        tvm = r.get("tvm") or {}
        tvm_text = (f"{tvm['median_ms']:.2f} ({tvm['median_ms'] / t['xnnpack']['median_ms']:.2f}x)" if "median_ms" in tvm
                    else "n/a (below)" if tvm.get("error") else "not run")
        cold = r.get("t1_cold")
        cold_text = (f"{cold['xnnpack']['median_ms']:.2f}, {cold['dnnfusion-all']['ratio']:.2f}x" if cold
                     else "not run")
        lines.append(f"| {r['model']} | {_ms(t['xnnpack'])} | {t['builtin']['ratio']:.2f}x | "
                     f"{t['dnnfusion-all']['ratio']:.2f}x | {t['dnnfusion-profitable']['ratio']:.2f}x | {cold_text} | "
                     f"{tvm_text} |")
    failed = [f"- TVM could not run {r['model']}: {r['tvm']['error']}" for r in rows if (r.get("tvm") or {}).get("error")]
    lines += [""] + failed if failed else []
    lines += ["", "Two threads (each contender in its own process, taking turns; noisy on 2 cores), median ms and "
              "ratio to XNNPACK at two threads:", "",
              "| model | XNNPACK | builtin | ours, all | ours, profitable |", "|---|---|---|---|---|"]
    for r in rows:
        t = r["t2"]
        lines.append(f"| {r['model']} | {t['xnnpack']['median_ms']:.2f} | {t['builtin']['ratio']:.2f}x | "
                     f"{t['dnnfusion-all']['ratio']:.2f}x | {t['dnnfusion-profitable']['ratio']:.2f}x |")
    lines += ["", "Fusion, memory and compile time:", "",
              "| model | TFLite ops | our kernels (profitable) | TVM kernels | fusion rate ours / TVM | "
              "peak MiB XNNPACK / builtin / ours all / ours profitable | planned activations MiB before / after | "
              "fuse cold / warm s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        peaks = " / ".join(f"{r['t1'][c]['peak_mib']:.0f}" for c in CONTENDERS)
        tvm_k = r.get("tvm_kernels")
        rate_tvm = f"{r['ops'] / tvm_k:.2f}" if tvm_k else "-"
        lines.append(f"| {r['model']} | {r['ops']} | {r['kernels']} ({r['profitable']}) | {tvm_k or '-'} | "
                     f"{r['ops'] / max(1, r['blocks']):.2f} / {rate_tvm} | {peaks} | "
                     f"{r['activations_before'] / 2**20:.1f} / {r['activations_after'] / 2**20:.1f} | "
                     f"{r['fuse_cold_s']:.0f} / {r['fuse_warm_s']:.1f} |")
    lines += _format_arm64(rows)
    lines += ["", "Charts: `bench/charts/speedup.png`, `bench/charts/fusion.png`, `bench/charts/memory.png`, "
              "`bench/charts/arm64.png`.", END]
    return "\n".join(lines) + "\n"


def _format_arm64(rows: list[dict]) -> list[str]:
    """The ARM64 table: per-invoke counts on qemu's cortex-a76, ours / XNNPACK."""
    from arm_count import ratio

    lines = ["", "ARM64, one thread, deterministic (bench/arm_count.py: qemu-aarch64 -cpu cortex-a76, a counting "
             "plugin, cycles on LLVM's Neoverse N1 pipeline model; per invoke, millions; ratios ours / XNNPACK, "
             "< 1: ours executes less):", "",
             "| model | XNNPACK M insns | XNNPACK M cycles | XNNPACK M mem | ours all: insns | cycles | mem | "
             "ours profitable: insns | cycles | mem |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        arm = r.get("arm64") or {"error": "not measured"}
        if "error" in arm:
            lines.append(f"| {r['model']} | {arm['error']} | | | | | | | | |")
            continue
        x, a, p = arm["xnnpack"], arm["dnnfusion-all"], arm["dnnfusion-profitable"]
        cycles = f"{x['cycles'] / 1e6:.1f}" if x.get("cycles") else "-"
        lines.append(f"| {r['model']} | {x['insns'] / 1e6:.1f} | {cycles} | {x['mems'] / 1e6:.1f} | "
                     f"{ratio(a, x, 'insns')} | {ratio(a, x, 'cycles')} | {ratio(a, x, 'mems')} | "
                     f"{ratio(p, x, 'insns')} | {ratio(p, x, 'cycles')} | {ratio(p, x, 'mems')} |")
    return lines


def draw_charts(rows: list[dict], folder: Path) -> list[Path]:
    """speedup.png (XNNPACK median / each runtime's, per model), fusion.png, memory.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    names = [r["model"] for r in rows]
    x = range(len(rows))
    paths = []

    def bars(series: dict[str, list[float]], title: str, ylabel: str, file: str, line: float | None = None) -> None:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / max(1, len(series))
        for k, (label, values) in enumerate(series.items()):
            ax.bar([i + k * width for i in x], values, width, label=label)
        if line is not None:
            ax.axhline(line, color="black", linewidth=0.8)
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in x], names, rotation=20, ha="right")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        fig.savefig(folder / file, dpi=110)
        plt.close(fig)
        paths.append(folder / file)

    speed = {c: [1.0 / r["t1"][c]["ratio"] for r in rows] for c in CONTENDERS}
    speed["tvm (untuned)"] = [r["t1"]["xnnpack"]["median_ms"] / r["tvm"]["median_ms"]
                              if "median_ms" in (r.get("tvm") or {}) else 0.0 for r in rows]
    bars(speed, "Speed relative to LiteRT + XNNPACK, one thread (higher is faster)", "x XNNPACK", "speedup.png", 1.0)
    bars({"TFLite ops": [r["ops"] for r in rows], "our kernels": [r["kernels"] for r in rows],
          "TVM kernels": [r.get("tvm_kernels") or 0 for r in rows]}, "Fusion: operators and kernels", "count",
         "fusion.png")
    bars({c: [r["t1"][c]["peak_mib"] for r in rows] for c in CONTENDERS}, "Peak resident memory growth", "MiB",
         "memory.png")
    arm = [r.get("arm64") or {} for r in rows]

    def arm_ratio(policy: str, what: str) -> list[float]:
        return [a[policy][what] / a["xnnpack"][what] if "xnnpack" in a else 0.0 for a in arm]

    bars({"instructions, all blocks": arm_ratio("dnnfusion-all", "insns"),
          "memory accesses, all blocks": arm_ratio("dnnfusion-all", "mems"),
          "instructions, profitable": arm_ratio("dnnfusion-profitable", "insns")},
         "ARM64 (cortex-a76, qemu): ours / XNNPACK per invoke (lower is better)", "ratio", "arm64.png", 1.0)
    return paths


def update_results(path: Path, section: str) -> None:
    """Replaces the marked section of RESULTS.md (or appends it)."""
    text = path.read_text() if path.exists() else "# Measured results\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Runs the set and writes RESULTS.md and the charts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--tvm-python", help="the Python of an environment with apache-tvm and tflite")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "run")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--from-rows", action="store_true", help="re-render the report from OUT/rows.json only")
    args = parser.parse_args(argv)
    command = "python bench/run.py" + (f" --runs {args.runs}" if args.runs != 100 else "") + \
              (" --tvm-python <tvm venv>/bin/python" if args.tvm_python else "")
    if args.from_rows:
        rows = json.loads((args.out / "rows.json").read_text())
        update_results(args.results, format_results(rows, environment(), command))
        draw_charts(rows, REPO / "bench" / "charts")
        return 0

    from zoo import reference_models

    models = args.models or reference_models()
    rows = []
    for model in models:
        start = time.perf_counter()
        rows.append(measure_model(model, args.out / model.stem, args.runs, args.tvm_python))
        print(f"{model.stem}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    update_results(args.results, format_results(rows, environment(), command))
    draw_charts(rows, REPO / "bench" / "charts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
