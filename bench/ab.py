"""Before and after, side by side: fused outputs of one model timed in one process, interleaved.

    python bench/ab.py [--threads 1] [--runs 60] [--claim all] before=OUT_OLD after=OUT_NEW [...]

Each NAME=OUT is a `tflite_tools fuse` output directory (its fused model and delegate library), for
example the same model fused by the previous commit (from a `git worktree` with its own
DNNFUSION_CACHE_DIR) and by the working tree. LiteRT + XNNPACK on the first one's fused model is timed
beside them. One invoke of each contender per round, so the machine's drift hits all of them alike;
prints each median and its ratio to XNNPACK's. This is the measurement to make before and after a
change that touches speed: separate runs on this machine differ by more than most changes do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _contender(out: Path, threads: int, claim: str):
    """An interpreter for a fuse output directory with its delegate claiming `claim`."""
    from tflite_tools import runtime

    (library,) = out.glob("lib*.so")
    delegate = runtime.load_delegate(str(library), options={"claim": claim, "num_threads": str(threads),
                                                            "log_level": "error"})
    return runtime.make_interpreter(str(out / "model.fused.tflite"), "xnnpack", threads, delegates=[delegate])


def main(argv: list[str] | None = None) -> int:
    """Prints one line per contender: median ms and its ratio to XNNPACK."""
    from tflite_tools import runtime

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", help="NAME=OUT_DIR, a fuse output directory")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--claim", default="all", help="the delegates' claim option (default all)")
    args = parser.parse_args(argv)
    named = [arg.split("=", 1) for arg in args.outputs]
    if any(len(pair) != 2 for pair in named):
        parser.error("each output is NAME=OUT_DIR")
    first = Path(named[0][1]) / "model.fused.tflite"
    interps = {"xnnpack": runtime.make_interpreter(str(first), "xnnpack", args.threads)}
    interps.update((name, _contender(Path(out), args.threads, args.claim)) for name, out in named)
    inputs = runtime.random_inputs(interps["xnnpack"])
    seconds: dict[str, list[float]] = {name: [] for name in interps}
    for round_ in range(args.warmup + args.runs):
        for name, interp in interps.items():
            start = time.perf_counter()
            runtime.run(interp, inputs)
            if round_ >= args.warmup:
                seconds[name].append(time.perf_counter() - start)
    base = statistics.median(seconds["xnnpack"])
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"{name:12s} {median * 1e3:8.3f} ms  {median / base:6.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
