"""Attention at the lengths models ship: the attention core (scores, scale, mask, softmax, weights x
values) as converters write it, at 128, 512 and 1024 tokens, fused by `tflite_tools fuse` and timed
through the delegate against LiteRT + XNNPACK's separate BATCH_MATMUL / SOFTMAX / BATCH_MATMUL.

    python bench/attention_table.py [--tokens 128 512 1024] [--runs 20] [--threads 1]

Cases: 12 heads of 64 with a padding mask (BERT's: an input [1, 1, 1, T] added to the scores) and with
a causal mask (GPT-2's: a constant [1, 1, T, T]), and grouped-query attention, 8 query heads over 2
and over 4 key/value heads, causal, in the form that puts each key/value head's query heads on its
rows (queries [1, KV, G*T, 64], keys and values [1, KV, T, 64]), as GQA is lowered to batched matrix
products that share their keys. Each model is fused for the host (its kernels in the user's cache),
then the fused model with the delegate claiming every block and LiteRT + XNNPACK on it are timed in
turns in one process (tflite_tools.bench.time_contenders; the median of `--runs` invokes each).
Prints one Markdown row per case and length: the kernels the model fused into, XNNPACK's ms, ours,
and the ratio (< 1: ours is faster).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEPTH = 64
# (label, query heads, key/value heads, mask)
CASES = [
    ("12 heads, padding mask", 12, 12, "padding"),
    ("12 heads, causal", 12, 12, "causal"),
    ("GQA 8 over 4 heads, causal", 8, 4, "causal"),
    ("GQA 8 over 2 heads, causal", 8, 2, "causal"),
]


def attention_model(tokens: int, heads: int, kv_heads: int, mask: str):
    """softmax(Q K^T / sqrt(64) + mask) V on [1, KV, G*T, 64] queries (G = heads / KV) and
    [1, KV, T, 64] keys and values."""
    import tflite_tools

    group = heads // kv_heads
    rows = group * tokens
    b = tflite_tools.ModelBuilder()
    q = b.input("q", [1, kv_heads, rows, DEPTH])
    k = b.input("k", [1, kv_heads, tokens, DEPTH])
    v = b.input("v", [1, kv_heads, tokens, DEPTH])
    scores = b.op("BATCH_MATMUL", [q, k], [1, kv_heads, rows, tokens], adj_y=True)
    scaled = b.op("MUL", [scores, b.const("scale", np.float32([DEPTH ** -0.5]))], scores.shape)
    if mask == "padding":
        bias = b.input("mask", [1, 1, 1, tokens])
    else:
        causal = np.triu(np.full((tokens, tokens), -1e9, np.float32), 1)
        bias = b.const("mask", np.tile(causal, (group, 1)).reshape(1, 1, rows, tokens))
    masked = b.op("ADD", [scaled, bias], scores.shape)
    weights = b.op("SOFTMAX", [masked], scores.shape, beta=1.0)
    b.output(b.op("BATCH_MATMUL", [weights, v], [1, kv_heads, rows, DEPTH]))
    return b.build()


def measure(tokens: int, heads: int, kv_heads: int, mask: str, runs: int, threads: int, work: Path) -> str:
    """One row: kernels, XNNPACK's median ms, ours and the ratio."""
    import tflite_tools
    from tflite_tools.bench import Contender, ratios, time_contenders
    from tflite_tools.fuse import fuse

    path = work / f"attention_{tokens}_{heads}_{kv_heads}_{mask}.tflite"
    path.write_bytes(tflite_tools.serialize(attention_model(tokens, heads, kv_heads, mask)))
    result = fuse(path, work / path.stem)
    kernels = sum(1 for k in result.kernels if k.kernel)
    cases = [Contender("xnnpack", str(result.model)),
             Contender("ours", str(result.model), delegate=str(result.library), claim="all")]
    timings = {t.name: t for t in time_contenders(cases, threads, runs, warmup=3)}
    ratio = ratios(list(timings.values()))["ours"]
    return (f"| {tokens} | {kernels} | {timings['xnnpack'].median / 1e3:.2f} | {timings['ours'].median / 1e3:.2f} | "
            f"{ratio:.2f} |")


def main(argv: list[str] | None = None) -> int:
    """Prints the table, a section per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[128, 512, 1024])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=[], help="case labels' first words (12, GQA)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dnnfusion-attention-") as tmp:
        for label, heads, kv_heads, mask in CASES:
            if args.only and label.split()[0] not in args.only:
                continue
            print(f"\n{label}, {args.threads} thread(s)\n")
            print("| tokens | kernels | XNNPACK ms | ours ms | ours / XNNPACK |")
            print("|---|---|---|---|---|", flush=True)
            for tokens in args.tokens:
                print(measure(tokens, heads, kv_heads, mask, args.runs, args.threads, Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
