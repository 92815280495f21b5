"""Before and after, side by side: fused outputs of one model timed interleaved.

    python bench/ab.py [--threads 1] [--runs 60] [--claim all] [--cold] before=OUT_OLD after=OUT_NEW [...]

Each NAME=OUT is a `tflite_tools fuse` output directory (its fused model and delegate library), for
example the same model fused by the previous commit (from a `git worktree` with its own
DNNFUSION_CACHE_DIR) and by the working tree. LiteRT + XNNPACK on the first one's fused model is timed
beside them, as `tflite_tools bench` times its contenders (tflite_tools.bench.time_contenders: one
process at one thread, a process per contender with more; turns of 10 invokes, or one with --cold). Prints each
median and its ratio to XNNPACK's. This is the measurement to make before and after a change that
touches speed: separate runs on a shared machine differ by more than most changes do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    """Prints one line per contender: median ms and its ratio to XNNPACK."""
    from tflite_tools.bench import Contender, ratios, time_contenders

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", help="NAME=OUT_DIR, a fuse output directory")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=60, help="timed invokes per contender")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--claim", default="all", help="the delegates' claim option (default all)")
    parser.add_argument("--cold", action="store_true", help="one invoke per turn, each after another contender's")
    args = parser.parse_args(argv)
    named = [arg.split("=", 1) for arg in args.outputs]
    if any(len(pair) != 2 for pair in named):
        parser.error("each output is NAME=OUT_DIR")
    cases = [Contender("xnnpack", str(Path(named[0][1]) / "model.fused.tflite"))]
    for name, out in named:
        (library,) = Path(out).glob("lib*.so")
        cases.append(Contender(name, str(Path(out) / "model.fused.tflite"), delegate=str(library), claim=args.claim))
    timings = time_contenders(cases, args.threads, args.runs, args.warmup, cold=args.cold)
    relative = ratios(timings)
    for t in timings:
        print(f"{t.name:12s} {t.median / 1e3:8.3f} ms  {relative[t.name]:6.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
