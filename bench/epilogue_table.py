"""What an activation after a matrix product costs: FULLY_CONNECTED + each float activation the
lowering knows, against the same FULLY_CONNECTED alone, both as the host's Halide kernels, with
LiteRT + XNNPACK on the FC + activation beside them.

    python bench/epilogue_table.py [--rows 128] [--depth 768] [--channels 3072] [--threads 1]
    python bench/epilogue_table.py --arm64 [--cpu cortex-a76] [--rows 32]

The default shape is BERT-base's and GPT-2's feed-forward expansion (128 tokens x 768 -> 3072).
Each activation is a separate op after the FC (as converters write GELU, TANH, ...), RELU and
RELU6 the FC's fused activation. The three contenders are timed in turns, nine rounds of at least
0.2 s each (halide_gen.profile.interleaved_seconds); times are medians over rounds, ratios medians of
each round's ratio. "of plain FC" is the plain FC's time over the FC + activation's: the share of the
plain FC's throughput the block keeps (1.00: the activation costs nothing).

With --arm64 the same models are fused for arm64-linux and counted under qemu (bench/arm_count.py):
instructions and estimated cycles per invoke on the core's pipeline model, ours against the plain FC
and against XNNPACK on the FC + activation. Deterministic, where a shared x86 host's times move by
a few percent from run to run: the figure to judge a few percent by.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

# (label, op after the FC or None, its options, the FC's fused activation)
ACTIVATIONS = [
    ("RELU (fused)", None, {}, "RELU"), ("RELU6 (fused)", None, {}, "RELU6"),
    ("GELU (erf)", "GELU", {"approximate": False}, None), ("GELU (tanh)", "GELU", {"approximate": True}, None),
    ("TANH", "TANH", {}, None), ("LOGISTIC", "LOGISTIC", {}, None), ("HARD_SWISH", "HARD_SWISH", {}, None),
    ("ELU", "ELU", {}, None), ("EXP", "EXP", {}, None), ("LEAKY_RELU", "LEAKY_RELU", {"alpha": 0.2}, None),
    ("RELU", "RELU", {}, None),
]


def fc_model(rows: int, depth: int, channels: int, op: str | None, options: dict, fused: str | None):
    """A model of one FULLY_CONNECTED (random weights and bias) and, when `op`, the op after it."""
    import tflite_tools

    rng = np.random.default_rng(0)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, rows, depth])
    w = b.const("w", (rng.standard_normal((channels, depth)) / np.sqrt(depth)).astype(np.float32))
    bias = b.const("bias", (rng.standard_normal(channels) / 10).astype(np.float32))
    y = b.op("FULLY_CONNECTED", [x, w, bias], [1, rows, channels], keep_num_dims=True,
             fused_activation_function=fused or "NONE")
    b.output(b.op(op, [y], [1, rows, channels], **options) if op else y)
    return b.build()


def contender(model, threads: int):
    """The model's ops as the host's Halide kernel and as LiteRT + XNNPACK, on the same random
    inputs: two callables that run one invoke each (halide_gen.profile.block_contenders)."""
    from halide_gen.profile import block_contenders, jit_kernel

    sg = model.main
    return block_contenders(sg.operators, sg.inputs, sg.outputs, jit_kernel("epilogue", sg.operators, sg.outputs),
                            threads)


def arm64_rows(shape: tuple[int, int, int], cpu: str, invokes: int) -> list[str]:
    """The table's rows from ARM64 counts: every model fused for the core and counted in one
    emulated run (with XNNPACK on each FC + activation beside it)."""
    import tempfile

    import tflite_tools
    from arm_count import Case, count, fuse_for_arm

    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for k, (label, op, options, fused) in enumerate([("plain FC", None, {}, None), *ACTIVATIONS]):
            path = Path(tmp) / f"fc_{k}.tflite"
            path.write_bytes(tflite_tools.serialize(fc_model(*shape, op, options, fused)))
            out = fuse_for_arm(path, Path(tmp) / f"out_{k}", cpu)
            cases.append(Case(f"ours {k}", out.model, out.library, {"claim": "all", "num_threads": "1"}))
            cases.append(Case(f"xnnpack {k}", path))
        counts = count(cases, cpu, invokes, cycles=True)
    plain = counts["ours 0"]
    rows = []
    for k, (label, *_rest) in enumerate(ACTIVATIONS, start=1):
        ours, xnn = counts[f"ours {k}"], counts[f"xnnpack {k}"]
        rows.append(f"| {label} | {ours.insns / 1e6:.2f} | {plain.insns / ours.insns:.3f} | {ours.cycles / 1e6:.2f} | "
                    f"{plain.cycles / ours.cycles:.3f} | {ours.cycles / xnn.cycles:.2f} |")
    return [f"| plain FC | {plain.insns / 1e6:.2f} | 1 | {plain.cycles / 1e6:.2f} | 1 | "
            f"{plain.cycles / counts['xnnpack 0'].cycles:.2f} |", *rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--depth", type=int, default=768)
    parser.add_argument("--channels", type=int, default=3072)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--min-seconds", type=float, default=0.2, help="per contender and round")
    parser.add_argument("--arm64", action="store_true", help="ARM64 instructions and cycles under qemu instead")
    parser.add_argument("--cpu", default="cortex-a76", help="with --arm64: qemu's core (bench/arm_count.py)")
    parser.add_argument("--invokes", type=int, default=2, help="with --arm64: counted invokes per model")
    args = parser.parse_args(argv)
    shape = (args.rows, args.depth, args.channels)
    if args.arm64:
        print(f"FULLY_CONNECTED {args.rows} x {args.depth} -> {args.channels} on {args.cpu}\n")
        print("| activation | ours M instructions | of plain FC | ours M cycles | of plain FC |"
              " cycles ours / XNNPACK |")
        print("|---|---|---|---|---|---|")
        print("\n".join(arm64_rows(shape, args.cpu, args.invokes)))
        return 0
    os.environ["HL_NUM_THREADS"] = str(args.threads)  # before Halide's JIT runtime starts

    from halide_gen.profile import interleaved_seconds

    gflop = 2 * args.rows * args.depth * args.channels / 1e9
    plain, _ = contender(fc_model(*shape, None, {}, None), args.threads)
    print(f"FULLY_CONNECTED {args.rows} x {args.depth} -> {args.channels}, {args.threads} thread(s)\n")
    print("| activation | FC + activation ms | plain FC ms | of plain FC | GFLOP/s | XNNPACK FC + activation ms |"
          " ours / XNNPACK |")
    print("|---|---|---|---|---|---|---|")
    for label, op, options, fused in ACTIVATIONS:
        ours, xnnpack = contender(fc_model(*shape, op, options, fused), args.threads)
        rounds = interleaved_seconds([ours, plain, xnnpack], args.rounds, args.min_seconds)
        act_s, plain_s, xnn_s = (statistics.median(s) for s in rounds)
        share = statistics.median(p / a for a, p, _ in zip(*rounds))
        versus = statistics.median(a / x for a, _, x in zip(*rounds))
        print(f"| {label} | {act_s * 1e3:.3f} | {plain_s * 1e3:.3f} | {share:.3f} | "
              f"{gflop / act_s:.0f} | {xnn_s * 1e3:.3f} | {versus:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
