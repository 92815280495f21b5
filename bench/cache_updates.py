"""What updating a KV cache in place saves: each block of a decoder signature that updates a cache,
its plain kernel against its in-place form, both on the cache passed in and out as one buffer.

    python bench/cache_updates.py MODEL [--signature decode] [--rounds 7]

A caller that shares the cache's input and output buffer (TFLite's custom allocations; what on-device
LLM runtimes do) gets TFLite's DYNAMIC_UPDATE_SLICE writing the new token alone; the delegate then
runs a block's in-place form (halide_gen.block.build_block), which writes the update and nothing else
of the cache, where the plain kernel writes the whole cache again. Both forms are JIT-compiled for
the host and timed in interleaved rounds on one thread (halide_gen.profile), each block once per
identity with a count of the blocks sharing it. Prints a Markdown table: block, ops, blocks of its
identity, plain ms, in-place ms, saved ms per token (over all blocks of the identity).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["HL_NUM_THREADS"] = "1"  # before Halide's JIT runtime starts

import numpy as np  # noqa: E402

import tflite_tools  # noqa: E402
from fusion.ecg import build_ecg  # noqa: E402
from fusion.plan import plan_fusion  # noqa: E402
from fusion.rewrite import rewrite  # noqa: E402
from halide_gen.block import build_block  # noqa: E402
from halide_gen.jit import JitKernel  # noqa: E402
from halide_gen.profile import interleaved_seconds, random_array  # noqa: E402


def _run_shared(kernel: JitKernel, data: dict) -> callable:
    """Binds `kernel` to `data` with each cache shared in and out; returns its run."""
    kernel.bind(kernel.inputs_from(data), shared=kernel.kernel.updates_in_place)
    kernel.run()  # warm: the first call allocates
    return kernel.run


def main(argv=None) -> None:
    """Prints the table for one signature of a decoder."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--signature", default="decode")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    model = tflite_tools.load(args.model)
    rewrite(model)
    labels = [model.subgraph_label(i) for i in range(len(model.subgraphs))]
    if args.signature not in labels:
        sys.exit(f"{args.model.name} has no signature {args.signature!r} (it has {', '.join(labels)})")
    sg = model.subgraphs[labels.index(args.signature)]
    plan = plan_fusion(build_ecg(sg))
    seen: dict[str, list] = {}
    for block in plan.blocks:
        if block.opaque_reason:
            continue
        ops = [plan.ecg.nodes[i].op for i in block.ops]
        if "DYNAMIC_UPDATE_SLICE" not in {op.name for op in ops}:
            continue
        plain = build_block(block.name, ops, block.outputs)
        if not plain.updates_in_place:
            continue
        if plain.identity in seen:
            seen[plain.identity][1] += 1
            continue
        seen[plain.identity] = [block, 1, ops, plain]
    print(f"{args.model.name} {args.signature}: one thread, median of {args.rounds} interleaved rounds\n")
    print("| block | ops | blocks | plain ms | in-place ms | saved ms a token |")
    print("|---|---|---|---|---|---|")
    total_plain = total_in_place = 0.0
    for block, count, ops, plain in seen.values():
        rng = np.random.default_rng(0)
        data = {id(t): random_array(t, rng) for t in block.inputs}
        in_place = build_block(block.name + "_in_place", ops, block.outputs, in_place=True)
        runs = [_run_shared(JitKernel(k), data) for k in (plain, in_place)]
        plain_s, in_place_s = (statistics.median(s) for s in interleaved_seconds(runs, args.rounds))
        total_plain += count * plain_s
        total_in_place += count * in_place_s
        names = " ".join(op.name for op in ops)
        print(f"| {block.name} | {names} | {count} | {plain_s * 1e3:.3f} | {in_place_s * 1e3:.3f} | "
              f"{count * (plain_s - in_place_s) * 1e3:.2f} |")
    print(f"| total | | {sum(c for _, c, _, _ in seen.values())} | {total_plain * 1e3:.2f} | "
          f"{total_in_place * 1e3:.2f} | {(total_plain - total_in_place) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
