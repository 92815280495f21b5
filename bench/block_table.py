"""Per-block timing: each planned block's Halide kernel vs LiteRT + XNNPACK on the same nodes.

    python bench/block_table.py [--threads 1 ...] [--limit N | --blocks NAME ...] [--delegate [--unique]
                                [--seconds S]] [MODEL ...]

MODEL defaults to the reference models (bench/zoo.py).

One thread by default (two-thread figures on a 2-core machine are noise). With --autoschedulers each
block also tries Halide's CPU autoschedulers and keeps the fastest source. By default each kernel is
JIT-compiled and called from Python (Halide's own thread pool, 0.7 us or more a call): quick, but blocks
of a few microseconds read slower than they run in a model. With --delegate each block is cut out into
a .tflite of its own, fused for the host, and run by LiteRT with the delegate claiming it beside XNNPACK
on the same cut-out (tflite_tools.bench, interleaved): both sides pay the same interpreter invoke and the
kernel runs on the delegate's pool, as in a model. Prints a Markdown table
per model: block, ops, Halide ms, XNNPACK ms, GFLOP/s of the Halide kernel, ratio (Halide / XNNPACK,
< 1 means Halide is faster), and a total over the model's blocks.

With --delegate, --threads takes several counts (one cut-out timed at each; the columns repeat per
count), --unique times one block of each signature (repeated layers once; a column counts them and
the total weighs them) and --seconds sizes each contender's runs to about that many seconds (at
least 20, at most --runs), so that a real-size model's table takes minutes, not hours.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def time_through_delegate(name: str, ops, inputs, outputs, threads: Sequence[int], runs: int, seconds: float = 0.0):
    """One block cut out into its own model, fused for the host, and timed through the delegate
    (claim:all) against LiteRT + XNNPACK on the same cut-out at each thread count: a profile.Timing
    each. With `seconds`, each contender runs about that long (see the module's docstring)."""
    import tempfile

    import tflite_tools
    from halide_gen.profile import Timing, cut_out
    from tflite_tools.bench import Contender, time_contenders
    from tflite_tools.fuse import fuse

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.tflite"
        path.write_bytes(tflite_tools.serialize(cut_out(ops, inputs, outputs)))
        result = fuse(path, Path(tmp) / "out")
        if not result.kernels:
            raise ValueError("fuse compiled no kernel for it")
        cases = [Contender("xnnpack", str(result.model)),
                 Contender("dnnfusion", str(result.model), delegate=str(result.library), claim="all")]
        timings = []
        for count in threads:
            wanted, warmup = runs, 50
            if seconds:
                # A first invoke's time, less its allocation, sizes the runs.
                probe = max(t.median for t in time_contenders(cases, count, runs=3, warmup=1)) / 1e6
                wanted = max(20, min(runs, int(seconds / probe)))
                warmup = max(2, wanted // 10)
            xnnpack, ours = time_contenders(cases, count, wanted, warmup=warmup)
            timings.append(Timing(ours.median / 1e6, xnnpack.median / 1e6, ours.median / xnnpack.median))
    return timings


def main(argv: list[str] | None = None) -> int:
    """Prints the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--threads", type=int, nargs="+", default=[1],
                        help="thread counts (more than one only with --delegate)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N blocks of each model")
    parser.add_argument("--blocks", nargs="+", default=(), help="only these blocks (plan.json's names)")
    parser.add_argument("--autoschedulers", action="store_true",
                        help="also time Halide's CPU autoschedulers per block and use the fastest source")
    parser.add_argument("--delegate", action="store_true",
                        help="time each block through the delegate on a cut-out .tflite (see above)")
    parser.add_argument("--runs", type=int, default=2000, help="invokes per contender with --delegate")
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="with --delegate: about this many seconds of runs per contender (20 runs at least)")
    parser.add_argument("--unique", action="store_true",
                        help="with --delegate: one block of each signature, counted (repeated layers once)")
    args = parser.parse_args(argv)
    if args.delegate and args.autoschedulers:
        parser.error("--delegate times what fuse compiles (the templates); it does not take --autoschedulers")
    if not args.delegate and (len(args.threads) > 1 or args.seconds or args.unique):
        parser.error("several --threads, --seconds and --unique go with --delegate")
    os.environ["HL_NUM_THREADS"] = str(args.threads[0])  # before Halide's JIT runtime starts

    import tflite_tools
    from fusion.ecg import build_ecg
    from fusion.plan import plan_fusion
    from fusion.rewrite import rewrite
    from fusion.signature import block_signature
    from halide_gen.lower import LoweringError
    from halide_gen.profile import choose_schedule, jit_kernel, time_block
    from tflite_tools.model.errors import ModelError
    from tflite_tools.model.stats import flops

    from zoo import reference_models

    paths = args.models or reference_models()
    for path in paths:
        model = tflite_tools.load(path)
        rewrite(model)
        plan = plan_fusion(build_ecg(model.main))
        print(f"\n### {path.stem}\n")
        ours = "delegate" if args.delegate else "Halide"
        per_thread = [f"{ours} ms | XNNPACK ms | ratio" + (f" ({n} thread{'s' * (n > 1)})" if len(args.threads) > 1 else "")
                      for n in args.threads]
        columns = ["block", "ops"] + (["count"] if args.unique else []) + per_thread[:1] + [f"{ours} GFLOP/s"]
        columns += per_thread[1:] + (["schedule"] if args.autoschedulers else [])
        header = " | ".join(columns)
        print(f"| {header} |")
        print("|" + "---|" * header.count(" | ") + "---|")
        blocks = [b for b in plan.blocks if not b.opaque_reason and (not args.blocks or b.name in args.blocks)]
        keys = {b.name: block_signature(plan.ecg, b.ops) if args.unique else b.name for b in blocks}
        counts = Counter(keys.values())
        if args.unique:  # the first block of each signature stands for the rest
            blocks = list({keys[b.name]: b for b in reversed(blocks)}.values())[::-1]
        totals = [[0.0, 0.0] for _ in args.threads]
        for block in blocks[: args.limit or None]:
            ops = [plan.ecg.nodes[i].op for i in block.ops]
            names = " ".join(op.name + (f"+{op.fused_activation}" if op.fused_activation else "") for op in ops)
            count = counts[keys[block.name]]
            lead = f"| {block.name} | {names} |" + (f" {count} |" if args.unique else "")
            try:
                source = "template"
                if args.delegate:
                    times = time_through_delegate(block.name, ops, block.inputs, block.outputs, args.threads,
                                                  args.runs, args.seconds)
                else:
                    if args.autoschedulers:
                        source = choose_schedule(ops, block.outputs, block.inputs).best
                    kernel = jit_kernel(block.name, ops, block.outputs, source)
                    times = [time_block(ops, block.inputs, block.outputs, kernel, threads=args.threads[0])]
            except (LoweringError, ModelError, RuntimeError, ValueError) as exc:
                print(f"{lead} - | - | - | not generated: {str(exc).splitlines()[0][:60]} |")
                continue
            work = sum(flops(op) for op in ops)
            gflops = f"{work / times[0].halide_s / 1e9:.1f}" if work else "-"
            cells = [f"{t.halide_s * 1e3:.3f} | {t.litert_s * 1e3:.3f} | {t.ratio:.2f}" for t in times]
            for total, t in zip(totals, times):
                total[0] += count * t.halide_s
                total[1] += count * t.litert_s
            print(f"{lead} {cells[0]} | {gflops} |" + "".join(f" {c} |" for c in cells[1:])
                  + (f" {source} |" if args.autoschedulers else ""), flush=True)
        if totals[0][1]:
            cells = [f"{h * 1e3:.2f} | {x * 1e3:.2f} | {h / x:.2f}" for h, x in totals]
            print("| total | |" + (" |" if args.unique else "") + f" {cells[0]} | |" + "".join(f" {c} |" for c in cells[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
