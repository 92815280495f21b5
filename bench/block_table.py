"""Per-block timing: each planned block's Halide kernel vs LiteRT + XNNPACK on the same nodes.

    python bench/block_table.py [--threads 1] [--limit N | --blocks NAME ...] [--delegate] [MODEL ...]

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
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def time_through_delegate(name: str, ops, inputs, outputs, threads: int, runs: int):
    """One block cut out into its own model, fused for the host, and timed through the delegate
    (claim:all) against LiteRT + XNNPACK on the same cut-out: a profile.Timing."""
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
        xnnpack, ours = time_contenders([
            Contender("xnnpack", str(result.model)),
            Contender("dnnfusion", str(result.model), delegate=str(result.library), claim="all"),
        ], threads, runs, warmup=50)
    return Timing(ours.median / 1e6, xnnpack.median / 1e6, ours.median / xnnpack.median)


def main(argv: list[str] | None = None) -> int:
    """Prints the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="only the first N blocks of each model")
    parser.add_argument("--blocks", nargs="+", default=(), help="only these blocks (plan.json's names)")
    parser.add_argument("--autoschedulers", action="store_true",
                        help="also time Halide's CPU autoschedulers per block and use the fastest source")
    parser.add_argument("--delegate", action="store_true",
                        help="time each block through the delegate on a cut-out .tflite (see above)")
    parser.add_argument("--runs", type=int, default=2000, help="invokes per contender with --delegate")
    args = parser.parse_args(argv)
    if args.delegate and args.autoschedulers:
        parser.error("--delegate times what fuse compiles (the templates); it does not take --autoschedulers")
    os.environ["HL_NUM_THREADS"] = str(args.threads)  # before Halide's JIT runtime starts

    import tflite_tools
    from fusion.ecg import build_ecg
    from fusion.plan import plan_fusion
    from fusion.rewrite import rewrite
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
        extra = " schedule |" if args.autoschedulers else ""
        ours = "delegate" if args.delegate else "Halide"
        print(f"| block | ops | {ours} ms | XNNPACK ms | {ours} GFLOP/s | ratio |" + extra)
        print("|---|---|---|---|---|---|" + ("---|" if args.autoschedulers else ""))
        total_h = total_x = 0.0
        blocks = [b for b in plan.blocks if not b.opaque_reason and (not args.blocks or b.name in args.blocks)]
        for block in blocks[: args.limit or None]:
            ops = [plan.ecg.nodes[i].op for i in block.ops]
            names = " ".join(op.name + (f"+{op.fused_activation}" if op.fused_activation else "") for op in ops)
            try:
                source = "template"
                if args.delegate:
                    t = time_through_delegate(block.name, ops, block.inputs, block.outputs, args.threads, args.runs)
                else:
                    if args.autoschedulers:
                        source = choose_schedule(ops, block.outputs, block.inputs).best
                    kernel = jit_kernel(block.name, ops, block.outputs, source)
                    t = time_block(ops, block.inputs, block.outputs, kernel, threads=args.threads)
            except (LoweringError, ModelError, RuntimeError, ValueError) as exc:
                print(f"| {block.name} | {names} | - | - | - | not generated: {str(exc).splitlines()[0][:60]} |")
                continue
            work = sum(flops(op) for op in ops)
            gflops = f"{work / t.halide_s / 1e9:.1f}" if work else "-"
            total_h += t.halide_s
            total_x += t.litert_s
            print(f"| {block.name} | {names} | {t.halide_s * 1e3:.3f} | {t.litert_s * 1e3:.3f} | {gflops} | "
                  f"{t.ratio:.2f} |" + (f" {source} |" if args.autoschedulers else ""), flush=True)
        if total_x:
            print(f"| total | | {total_h * 1e3:.2f} | {total_x * 1e3:.2f} | | {total_h / total_x:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
