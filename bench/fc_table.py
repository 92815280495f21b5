"""Fully connected layers at transformer sizes, with weights that outgrow the caches as a real model's do:
BERT-base's (hidden 768, 12 layers) and BERT-large's (1024, 24 layers) projections and feed-forward
layers over 128 tokens, fused for the host and timed through the delegate against LiteRT + XNNPACK.

    python bench/fc_table.py [--tokens 128] [--runs 15] [--threads 1 2] [--only base large]

Each case is a chain of FULLY_CONNECTED layers of one kind, one per layer of the model (random weights,
each layer's its own): "d -> d" the attention projections, "d -> 4d -> d" the feed-forward pair. A
layer's weights are read once per invoke, so the chain streams the model's weights of that kind from
memory, not from a cache one layer's weights fit in. "one layer" runs the same layer 12 times instead,
its weights staying in the caches: the difference between the two is what weight traffic costs.
Columns: XNNPACK's ms, ours, the ratio (< 1: ours is faster), our GFLOP/s and the weights' GB/s (the
chain's weight bytes over our time).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (label, hidden size, layers)
MODELS = [("base", 768, 12), ("large", 1024, 24)]


def chain_model(tokens: int, widths: list[int], shared: bool):
    """FULLY_CONNECTED layers from widths[k] to widths[k + 1] features over `tokens` rows (bias, no
    activation); `shared`: every layer reads the first layer's weights (they stay in cache)."""
    import tflite_tools

    rng = np.random.default_rng(0)
    b = tflite_tools.ModelBuilder()
    y = b.input("x", [1, tokens, widths[0]])
    weights = {}
    for k, (depth, channels) in enumerate(zip(widths, widths[1:])):
        key = (depth, channels) if shared else k
        if key not in weights:
            w = (rng.standard_normal((channels, depth)) / np.sqrt(depth)).astype(np.float32)
            weights[key] = (b.const(f"w{k}", w), b.const(f"b{k}", np.zeros(channels, np.float32)))
        y = b.op("FULLY_CONNECTED", [y, *weights[key]], [1, tokens, channels], keep_num_dims=True)
    b.output(y)
    return b.build()


def cases(tokens: int, only: list[str]):
    """(label, model, FLOPs, weight bytes read per invoke) for each case."""
    for name, hidden, layers in MODELS:
        if only and name not in only:
            continue
        for kind, unit in (("d -> d", [hidden]), ("d -> 4d -> d", [hidden, 4 * hidden])):
            for label, widths, shared in ((f"{layers} layers", unit * layers + [hidden], False),
                                          ("one layer x 12", unit * (12 // len(unit)) + [hidden], True)):
                pairs = list(zip(widths, widths[1:]))
                yield (f"{name} {hidden}, {label}: {kind}", chain_model(tokens, widths, shared),
                       sum(2 * tokens * d * c for d, c in pairs), sum(4 * d * c for d, c in pairs))


def main(argv: list[str] | None = None) -> int:
    """Prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--only", nargs="*", default=[], help="base, large")
    args = parser.parse_args(argv)

    import tflite_tools
    from tflite_tools.bench import Contender, time_contenders
    from tflite_tools.fuse import fuse

    print("| case | threads | XNNPACK ms | ours ms | ours / XNNPACK | ours GFLOP/s | weights GB/s |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for k, (label, model, flops, streamed) in enumerate(cases(args.tokens, args.only)):
            path = Path(tmp) / f"case{k}.tflite"
            path.write_bytes(tflite_tools.serialize(model))
            result = fuse(path, Path(tmp) / f"out{k}")
            for threads in args.threads:
                xnnpack, ours = time_contenders([
                    Contender("xnnpack", str(result.model)),
                    Contender("dnnfusion", str(result.model), delegate=str(result.library), claim="all"),
                ], threads, args.runs, warmup=3)
                seconds = ours.median / 1e6
                print(f"| {label} | {threads} | {xnnpack.median / 1e3:.2f} | {ours.median / 1e3:.2f} | "
                      f"{ours.median / xnnpack.median:.2f} | {flops / seconds / 1e9:.0f} | "
                      f"{streamed / seconds / 1e9:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
