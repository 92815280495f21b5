"""The ARM64 cost measure: aarch64 instructions, memory accesses and estimated cycles per invoke,
counted under qemu.

    python bench/arm_count.py MODEL [MODEL ...] [--cpu cortex-a76 [cortex-a53]] [--delegate LIB --fused MODEL]
                              [--precision fp16] [--signature NAME] [--blocks] [--hot N] [--invokes 5]
                              [--no-cycles] [--json]

There is no ARM hardware here, and timings on this shared x86 machine move with its load. What does
not move: the instructions an aarch64 CPU executes for one invoke. QEMU's user-mode emulator runs an
aarch64 Python with LiteRT (bench/arm64_rootfs.py prepares it) with a TCG plugin
(bench/arm64/counter.c) that counts every guest instruction and memory access; the guest script
(bench/arm64/guest.py) marks the counters just before and after K invokes, after a warm-up, so the
difference is what those invokes executed and nothing of the process's start-up. Repeated runs agree
to a few hundredths of a percent (tests/test_arm_count.py checks 0.5 %).

Per model it counts, one thread each, on each chosen `-cpu` (default cortex-a76, a phone's big core:
NEON, dot product, fp16; cortex-a53 is a little ARMv8.0 core without dot product), with that core's
/proc/cpuinfo (arm64_rootfs.core_view):
- LiteRT + XNNPACK alone (XNNPACK's NEON micro-kernels, picked for that core: on the A53 its in-order ones);
- the model fused for arm64-linux (arm64-linux-nodot on the A53) with our delegate claiming every
  block (`claim=all`) and with its default policy (`claim=profitable`); XNNPACK runs what the delegate leaves.
With --precision fp16 (the big core only), both compute in half precision: XNNPACK with its FORCE_FP16
flag (LiteRT's CompiledModel API takes XNNPACK's flags: `CpuOptions(xnnpack_flags=...)`; the Interpreter
API cannot), ours fused for arm64-linux-fp16 (`fuse --cpu-precision fp16`).
With --blocks, each planned block is also cut out into a model of its own (as bench/block_table.py
does for x86 time) and counted both ways, so that the losses have names.

Cycles: the plugin also counts the executions of each translated block, and bench/arm_cycles.py
times each block on LLVM's pipeline model of the core (llvm-mca; the big core on its Neoverse N1
model, the little one on its Cortex-A55 model): cycles per invoke = executions x steady-state
cycles per pass, summed. Neither figure sees cache misses: read both beside the memory accesses,
and never trade a few instructions or cycles for many more accesses. The pipeline models' limits,
measured on microkernels, are in bench/arm_cycles.py and bench/RESULTS.md. --hot N lists, per
contender, the N translated blocks that take the most cycles, with the multiply-adds they issue a
cycle: a GEMM loop's rate against the core's peak. Beside XNNPACK's cycles stands the floor: the
model's multiply-adds at the core's peak rate (bench/arm_cycles.py PEAK_MULTIPLY_ADDS), as a ratio to
XNNPACK's cycles; a model whose floor is near XNNPACK's own cycles leaves a schedule nothing to gain
in this measure, however much memory traffic fusion saves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from arm_cycles import PipelineModel, floor_cycles, read_blocks  # noqa: E402

HERE = REPO / "bench" / "arm64"
CPUS = {
    "cortex-a76": "big core (ARMv8.2: NEON, dot product, fp16)",
    "cortex-a53": "little core (ARMv8.0: NEON, no dot product)",
}
# The build each CPU runs: arm64-linux kernels use SDOT, which an ARMv8.0 core lacks.
TARGETS = {"cortex-a76": "arm64-linux", "cortex-a53": "arm64-linux-nodot"}
PRECISIONS = ("fp32", "fp16")

# XNNPACK's delegate flags (xnnpack_delegate.h) as LiteRT's CpuOptions pass them: the value replaces
# the defaults, so the int8 and dynamic fully connected paths it enables by default are kept.
XNNPACK_QS8, XNNPACK_QU8, XNNPACK_FORCE_FP16, XNNPACK_DYNAMIC_FULLY_CONNECTED = 0x1, 0x2, 0x4, 0x8
XNNPACK_FP16_FLAGS = XNNPACK_QS8 | XNNPACK_QU8 | XNNPACK_FORCE_FP16 | XNNPACK_DYNAMIC_FULLY_CONNECTED


@dataclass(frozen=True)
class Count:
    """Per-invoke figures of one case."""

    insns: float  # aarch64 instructions executed
    mems: float  # memory accesses (loads and stores, each counted once whatever its width)
    cycles: float | None = None  # estimated on the core's pipeline model (None: not asked for)
    unmodelled: float = 0.0  # instructions in blocks the model could not read, charged a cycle each
    hot: tuple[dict, ...] = ()  # the blocks that take the most cycles (arm_cycles.HotBlock), when asked for


@dataclass
class Case:
    """One model to count, with an optional external delegate and its options."""

    name: str
    model: Path
    delegate: Path | None = None
    options: dict[str, str] = field(default_factory=dict)
    # XNNPACK's flags, where the case runs through LiteRT's CompiledModel with them (None: the
    # Interpreter with XNNPACK's defaults).
    xnnpack_flags: int | None = None
    signature: str | None = None  # the signature invoked (None: the entry subgraph)


def build_counter(cache_dir: Path) -> Path:
    """The plugin, compiled once per source version into the cache."""
    source = HERE / "counter.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    library = cache_dir / f"arm-count-{digest}.so"
    if not library.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(partial), str(source)], check=True)
        os.replace(partial, library)
    return library


def rootfs(cache_dir: Path, cpu: str) -> Path:
    """The emulated aarch64 Python with LiteRT (prepared once; needs the package registries), as
    seen on qemu's core `cpu` (its cpuinfo)."""
    from arm64_rootfs import core_view, prepare

    return core_view(prepare(cache_dir), cpu)


def write_inputs(model: Path, path: Path, seed: int, signature: str | None = None) -> Path:
    """The case's inputs as the host's tools make them (tflite_tools.runtime.random_inputs: integer
    inputs under the tables they index), saved for the guest, which has numpy and LiteRT only. A
    signature's, by name: floats normal, integers 0 (a decoder's first token at position 0; its
    attention reads the whole cache under a mask at any position, so the work is the same)."""
    import numpy as np

    from tflite_tools.runtime import make_interpreter, random_inputs

    interp = make_interpreter(model)
    if signature is None:
        np.savez(path, *random_inputs(interp, seed))
        return path
    rng = np.random.default_rng(seed)
    details = interp.get_signature_runner(signature).get_input_details()
    np.savez(path, **{name: rng.standard_normal(d["shape"]).astype(d["dtype"]) if np.dtype(d["dtype"]).kind == "f"
                      else np.zeros(d["shape"], d["dtype"]) for name, d in details.items()})
    return path


def count(cases: list[Case], cpu: str = "cortex-a76", invokes: int = 5, warmup: int = 2,
          cache_dir: Path | None = None, cycles: bool = False, hot: int = 0) -> dict[str, Count]:
    """Per-invoke counts of each case, all in one emulated process on `cpu`, one thread; with
    `cycles`, each also estimated in cycles on the core's pipeline model (bench/arm_cycles.py), and
    its `hot` costliest translated blocks listed."""
    from fusion.cost import default_cache_dir

    cache_dir = cache_dir or default_cache_dir()
    root, plugin = rootfs(cache_dir, cpu), build_counter(cache_dir)
    with tempfile.TemporaryDirectory() as tmp:
        job, marks, blocks = Path(tmp) / "job.json", Path(tmp) / "marks.txt", Path(tmp) / "blocks.txt"
        job.write_text(json.dumps({"warmup": warmup, "invokes": invokes, "threads": 1, "cases": [
            {"model": str(c.model.resolve()), "delegate": str(c.delegate.resolve()) if c.delegate else None,
             "options": c.options, "xnnpack_flags": c.xnnpack_flags, "signature": c.signature,
             "inputs": str(write_inputs(c.model, Path(tmp) / f"inputs-{i}.npz", seed=i, signature=c.signature))}
            for i, c in enumerate(cases)]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(ARM_COUNT_OUT=str(marks), PYTHONHASHSEED="0")
        if cycles:
            env["ARM_COUNT_BLOCKS"] = str(blocks)
        proc = subprocess.run(["qemu-aarch64", "-cpu", cpu, "-plugin", str(plugin), "-L", str(root),
                               str(root / "usr" / "bin" / "python3.11"), str(HERE / "guest.py"), str(job)],
                              capture_output=True, text=True, env=env, timeout=3 * 3600)
        if proc.returncode != 0:
            raise RuntimeError(f"the emulated run failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
        points = {}
        for line in marks.read_text().splitlines():
            what, tag, insns, mems = line.split()
            if what == "mark":
                points[int(tag)] = (int(insns), int(mems))
        code, executions = read_blocks(blocks) if cycles else ({}, {})
    model = PipelineModel(cpu, cache_dir) if cycles else None
    result = {}
    for i, case in enumerate(cases):
        (i0, m0), (i1, m1) = points[2 * i], points[2 * i + 1]
        result[case.name] = Count((i1 - i0) / invokes, (m1 - m0) / invokes)
        if model:
            per_invoke = {block: n / invokes for block, n in executions.get(2 * i + 1, {}).items()}
            e = model.estimate(code, per_invoke, hot)
            blocks_hot = tuple({**asdict(b), "multiply_adds_per_cycle": b.multiply_adds_per_cycle} for b in e.hot)
            result[case.name] = Count(result[case.name].insns, result[case.name].mems, e.cycles, e.unmodelled,
                                      blocks_hot)
    return result


def fuse_for_arm(model: Path, out: Path, cpu: str = "cortex-a76", precision: str = "fp32"):
    """`fuse --target arm64-linux` (or -nodot, for a core without dot product; -fp16 in half
    precision) of `model` into `out` (kernels from the shared cache)."""
    from tflite_tools.fuse import fuse

    return fuse(model, out, target=target_for(cpu, precision))


def target_for(cpu: str, precision: str) -> str:
    """The build `cpu` runs in `precision` (halide_gen.targets.with_cpu_precision of its own);
    ValueError, saying why, for a core without it (the A53's build has no fp16 arithmetic)."""
    from halide_gen.targets import with_cpu_precision

    return with_cpu_precision(TARGETS[cpu], precision)


def xnnpack_case(name: str, model: Path, precision: str, signature: str | None = None) -> Case:
    """LiteRT + XNNPACK alone on `model`, in `precision` (fp16: its FORCE_FP16 flag)."""
    return Case(name, model, xnnpack_flags=XNNPACK_FP16_FLAGS if precision == "fp16" else None, signature=signature)


def claimed_nodes(report: Path, signature: str | None = None) -> int:
    """How many nodes the delegate claimed (in the entry subgraph, or `signature`'s), from its
    report option's file."""
    from tflite_tools.run import read_claims

    claims = read_claims(report)
    if claims and signature:
        claims = claims["subgraphs"].get(signature)
    return len(claims.get("claimed_nodes") or []) if claims else 0


def multiply_adds(model: Path, precision: str = "fp32", signature: str | None = None) -> dict[str, int]:
    """The multiply-adds of one invoke of `model` (of `signature`'s subgraph, where named) by the
    arithmetic they run in: float products in `precision`, products of int8 or int4 operands (the
    quantized ops, and dynamic-range ones, which both runtimes compute in int8) as "int8"."""
    import tflite_tools
    from tflite_tools.model.schema import fb
    from tflite_tools.model.stats import macs

    loaded = tflite_tools.load(model)
    index = next((s.subgraph_index for s in loaded.signatures if s.key == signature), 0) if signature else 0
    integer = {fb.TensorType.INT8, fb.TensorType.UINT8, fb.TensorType.INT4}
    names = {v: k.lower() for k, v in vars(fb.TensorType).items() if not k.startswith("_")}
    totals: dict[str, int] = {}
    for op in loaded.subgraphs[index].operators:
        if not (n := macs(op)):
            continue
        types = {t.dtype for t in op.inputs if t is not None and t.dtype != fb.TensorType.INT32}  # not shapes, biases
        kind = ("int8" if types & integer else precision if types <= {fb.TensorType.FLOAT32}
                else "+".join(sorted(names.get(t, str(t)) for t in types)))
        totals[kind] = totals.get(kind, 0) + n
    return totals


def model_counts(model: Path, cpu: str, work: Path, invokes: int, fused=None, cycles: bool = True,
                 hot: int = 0, precision: str = "fp32", signature: str | None = None) -> dict:
    """XNNPACK alone against our delegate (claim all, and the default policy) on one model (one of
    its signatures, where named), both in `precision`."""
    work.mkdir(parents=True, exist_ok=True)
    fused = fused or fuse_for_arm(model, work / "out", cpu, precision)
    reports = {policy: work / f"claims-{policy}.json" for policy in ("all", "profitable")}
    cases = [xnnpack_case("xnnpack", model, precision, signature)]
    cases += [Case(f"dnnfusion-{policy}", fused.model, fused.library,
                   {"claim": policy, "num_threads": "1", "report": str(reports[policy])}, signature=signature)
              for policy in reports]
    counts = count(cases, cpu, invokes, cycles=cycles, hot=hot)
    row = {"model": f"{model.stem} {signature}" if signature else model.stem, "cpu": cpu, "precision": precision,
           "floor_cycles": floor_cycles(multiply_adds(model, precision, signature), cpu),
           **{name: asdict(c) for name, c in counts.items()}}
    for policy, report in reports.items():
        row[f"dnnfusion-{policy}"]["claimed_nodes"] = claimed_nodes(report, signature)
    return row


def block_counts(model: Path, cpu: str, work: Path, invokes: int, cycles: bool = True,
                 precision: str = "fp32") -> list[dict]:
    """Each planned block cut out into a model of its own, fused, and counted against XNNPACK on the
    same nodes, both in `precision`."""
    import tflite_tools
    from fusion.pipeline import plan_model
    from halide_gen.lower import LoweringError
    from halide_gen.profile import cut_out
    from tflite_tools.model.errors import ModelError

    summary = plan_model(tflite_tools.load(model))
    plan = summary.plan
    cases, rows = [], []
    for block in plan.blocks:
        if block.opaque_reason:
            continue
        ops = [plan.ecg.nodes[i].op for i in block.ops]
        names = " ".join(op.name + (f"+{op.fused_activation}" if op.fused_activation else "") for op in ops)
        piece = work / f"{block.name}.tflite"
        tflite_tools.save(cut_out(ops, block.inputs, block.outputs), piece)
        try:
            fused = fuse_for_arm(piece, work / block.name, cpu, precision)
        except (LoweringError, ModelError, RuntimeError) as exc:
            rows.append({"block": block.name, "ops": names, "error": str(exc).splitlines()[0][:80]})
            continue
        report = work / f"{block.name}.claims.json"
        cases += [xnnpack_case(f"{block.name}/xnnpack", piece, precision),
                  Case(f"{block.name}/ours", fused.model, fused.library,
                       {"claim": "all", "num_threads": "1", "report": str(report)})]
        rows.append({"block": block.name, "ops": names, "report": report})
    counts = count(cases, cpu, invokes, cycles=cycles)
    for row in rows:
        if "error" in row:
            continue
        ours, xnn = counts[f"{row['block']}/ours"], counts[f"{row['block']}/xnnpack"]
        row.update(ours=asdict(ours), xnnpack=asdict(xnn), claimed=claimed_nodes(row.pop("report")) > 0)
    return rows


def _m(n: float) -> str:
    return f"{n / 1e6:.2f}"


def ratio(ours: dict, xnn: dict, key: str) -> str:
    """ours[key] / xnn[key] to three places, or "-" where either is missing."""
    return f"{ours[key] / xnn[key]:.3f}" if ours.get(key) and xnn.get(key) else "-"


def format_models(rows: list[dict]) -> str:
    """The per-model table (M = millions per invoke; ratios are ours / XNNPACK; cycles on the core's
    pipeline model, IPC = instructions / cycles; the floor ratio is the model's multiply-adds at the
    core's peak rate over XNNPACK's cycles, below which no schedule's cycles ratio can go)."""
    lines = ["| model | cpu | precision | XNNPACK M insns | M cycles (IPC) | floor ratio | all: insns ratio | cycles ratio | "
             "mem ratio | profitable: insns ratio | cycles ratio | mem ratio | nodes claimed (all / profitable) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        x, a, p = r["xnnpack"], r["dnnfusion-all"], r["dnnfusion-profitable"]
        cycles = f"{_m(x['cycles'])} ({x['insns'] / x['cycles']:.2f})" if x.get("cycles") else "-"
        floor = ratio({"cycles": r.get("floor_cycles")}, x, "cycles")
        lines.append(f"| {r['model']} | {r['cpu']} | {r.get('precision', 'fp32')} | {_m(x['insns'])} | {cycles} | {floor} | "
                     f"{ratio(a, x, 'insns')} | "
                     f"{ratio(a, x, 'cycles')} | {ratio(a, x, 'mems')} | {ratio(p, x, 'insns')} | "
                     f"{ratio(p, x, 'cycles')} | {ratio(p, x, 'mems')} | "
                     f"{a['claimed_nodes']} / {p['claimed_nodes']} |")
    return "\n".join(lines)


def format_blocks(model: str, rows: list[dict]) -> str:
    """The per-block table of one model, the largest excess first (in cycles where estimated)."""
    done = [r for r in rows if "error" not in r]
    key = "cycles" if done and done[0]["ours"].get("cycles") else "insns"
    done.sort(key=lambda r: -(r["ours"][key] - r["xnnpack"][key]))
    lines = [f"#### {model}", "", f"| block | ops | ours M insns | XNNPACK M insns | insns ratio | ours M cycles | "
             f"XNNPACK M cycles | cycles ratio | mem ratio | excess M {key} |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in done:
        o, x = r["ours"], r["xnnpack"]
        note = "" if r["claimed"] else " (not claimed)"
        cycles = f"{_m(o['cycles'])} | {_m(x['cycles'])}" if key == "cycles" else "- | -"
        lines.append(f"| {r['block']}{note} | {r['ops']} | {_m(o['insns'])} | {_m(x['insns'])} | "
                     f"{ratio(o, x, 'insns')} | {cycles} | {ratio(o, x, 'cycles')} | {ratio(o, x, 'mems')} | "
                     f"{(o[key] - x[key]) / 1e6:+.2f} |")
    total = {k: (sum(r["ours"][k] for r in done), sum(r["xnnpack"][k] for r in done))
             for k in ("insns", key)}
    if total["insns"][1]:
        (oi, xi), (ok, xk) = total["insns"], total[key]
        cycles = f"{_m(ok)} | {_m(xk)} | {ok / xk:.3f}" if key == "cycles" else "- | - | -"
        lines.append(f"| total | | {_m(oi)} | {_m(xi)} | {oi / xi:.3f} | {cycles} | | {(ok - xk) / 1e6:+.2f} |")
    lines += [f"| {r['block']} | {r['ops']} | - | - | - | - | - | - | - | not built: {r['error']} |"
              for r in rows if "error" in r]
    return "\n".join(lines)


def format_hot(rows: list[dict]) -> str:
    """Per model, core and contender, the translated blocks that take the most cycles: their share,
    executions per invoke, cycles per pass, multiply-adds a cycle and instruction mix."""
    from collections import Counter

    lines = []
    for r in rows:
        for case in ("xnnpack", "dnnfusion-all"):
            if not r[case].get("hot"):
                continue
            lines += ["", f"#### {r['model']} on {r['cpu']}: {case}", "",
                      "| share of cycles | executions / invoke | cycles / pass | multiply-adds / cycle | "
                      "instructions |", "|---|---|---|---|---|"]
            for b in r[case]["hot"]:
                mix = Counter(i.split()[0] for i in b["instructions"])
                text = ", ".join(f"{name} x{n}" for name, n in mix.most_common(6))
                lines.append(f"| {b['share']:.1%} | {b['executions']:,.0f} | {b['cycles_per_pass']:.2f} | "
                             f"{b['multiply_adds_per_cycle']:.2f} | {len(b['instructions'])}: {text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Counts the models and prints Markdown tables (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--cpu", nargs="+", default=["cortex-a76"], choices=sorted(CPUS),
                        help="qemu -cpu names: each is counted in its own emulated runs (default cortex-a76)")
    parser.add_argument("--delegate", type=Path, help="an arm64-linux delegate library already built (with --fused)")
    parser.add_argument("--fused", type=Path, help="the fused model that goes with --delegate")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp16: XNNPACK with FORCE_FP16 against the arm64-linux-fp16 build (big core only)")
    parser.add_argument("--signature", help="invoke this signature (a decoder's decode: a token's count); "
                        "integer inputs 0, floats normal")
    parser.add_argument("--blocks", action="store_true", help="also count every block cut out on its own")
    parser.add_argument("--invokes", type=int, default=5, help="invokes counted per case, after 2 to warm up")
    parser.add_argument("--no-cycles", action="store_true", help="instructions and memory accesses only")
    parser.add_argument("--hot", type=int, default=0, metavar="N",
                        help="list each contender's N translated blocks that take the most cycles")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if bool(args.delegate) != bool(args.fused) or (args.delegate and (len(args.models) != 1 or len(args.cpu) != 1)):
        parser.error("--delegate and --fused go together, with one model and one --cpu")
    if args.signature and args.blocks:
        parser.error("--blocks cuts blocks out of the entry subgraph: not with --signature")
    for cpu in args.cpu:
        try:
            target_for(cpu, args.precision)
        except ValueError as exc:
            parser.error(f"--precision {args.precision} on {cpu}: {exc}")

    rows, blocks = [], {}
    for model in args.models:
        for cpu in args.cpu:
            with tempfile.TemporaryDirectory() as tmp:
                fused = None
                if args.delegate:
                    fused = argparse.Namespace(model=args.fused, library=args.delegate)
                rows.append(model_counts(model, cpu, Path(tmp), args.invokes, fused, not args.no_cycles,
                                         0 if args.no_cycles else args.hot, args.precision, args.signature))
                if args.blocks:
                    blocks[f"{model.stem} on {cpu}"] = block_counts(model, cpu, Path(tmp), args.invokes,
                                                                    not args.no_cycles, args.precision)
    if args.json:
        print(json.dumps({"models": rows, "blocks": blocks}, indent=1))
        return 0
    print(format_models(rows))
    if args.hot:
        print(format_hot(rows))
    for name, table in blocks.items():
        print("\n" + format_blocks(name, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
