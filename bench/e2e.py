"""End-to-end latency per reference model: LiteRT + XNNPACK, LiteRT builtin, our delegate claiming
every block, and claiming only the blocks measured faster, in one process per model with
interleaved runs (tflite_tools.bench), plus peak memory per contender in a process of its own.

    python bench/e2e.py [--threads 1] [--runs 30] [--out bench/out] [MODEL ...]   # default: ../shared/models

Each model is first fused with `fuse --measure` (kernels and block timings are cached, so a rerun
only re-times). Prints one Markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    """Fuses, times and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out")
    args = parser.parse_args(argv)

    from tflite_tools.bench import benchmark, measure_peak_memory, ratios
    from tflite_tools.fuse import fuse

    models = args.models or sorted((REPO.parent / "shared" / "models").glob("*.tflite"))
    rows = []
    for model in models:
        start = time.perf_counter()
        result = fuse(model, args.out / model.stem, measure=True)
        fuse_s = time.perf_counter() - start
        with_kernel = [k for k in result.kernels if k.kernel]
        timings = benchmark(str(result.model), str(result.library), args.threads, args.runs, warmup=3)
        measure_peak_memory(timings, str(result.model), str(result.library), args.threads)
        by_name = {t.name: t for t in timings}
        rel = ratios(timings)
        rows.append((model.stem, by_name, rel, len(with_kernel), sum(k.profitable for k in result.kernels),
                     len(result.kernels), fuse_s))
        print(f"{model.stem}: done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    print("| model | XNNPACK ms | builtin | ours, all blocks | ours, profitable blocks | blocks with kernels / "
          "profitable / all | peak MiB (XNNPACK / builtin / all / profitable) | fuse s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, t, rel, kernels, profitable, blocks, fuse_s in rows:
        mem = " / ".join(f"{t[c].peak_memory_kib / 1024:.0f}" for c in ("xnnpack", "builtin", "dnnfusion-all",
                                                                       "dnnfusion-profitable"))
        print(f"| {name} | {t['xnnpack'].median / 1e3:.2f} | {rel['builtin']:.2f}x | {rel['dnnfusion-all']:.2f}x | "
              f"{rel['dnnfusion-profitable']:.2f}x | {kernels} / {profitable} / {blocks} | {mem} | {fuse_s:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
