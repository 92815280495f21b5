"""How long `tflite_tools.load` takes and how much memory it needs, per model.

    python bench/load_model.py [MODEL ...]    # default: the reference models (bench/zoo.py)

Each model is measured in a fresh process, so the peak resident set belongs to that load alone:
`peak RSS growth` is the process's peak resident memory after loading minus its resident memory just
before (imports done: `tflite_tools` imports the reader's modules, numpy and the schema, on first
use, so a small test model is loaded first), and `tracemalloc peak` is the largest Python heap during
the load. Load time
is the median of 7 loads (the first one, which warms the page cache, is dropped).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

_CHILD = r"""
import json, resource, sys, time, tracemalloc
import tflite_tools

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

path, small = sys.argv[1], sys.argv[2]
tflite_tools.load(small)  # the reader's imports, which are not the load's memory
before = rss_bytes()
tracemalloc.start()
model = tflite_tools.load(path)
_, heap_peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
times = []
for _ in range(8):
    t = time.perf_counter()
    tflite_tools.load(path)
    times.append(time.perf_counter() - t)
print(json.dumps({"peak_rss_growth": peak - before, "heap_peak": heap_peak, "times": times[1:]}))
"""


def measure(path: Path) -> dict:
    """Runs one model's measurement in a fresh interpreter and returns its figures."""
    from zoo import models_from_tests

    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(models_from_tests(["add_relu"])[0])],
        capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    figures["median_s"] = statistics.median(figures.pop("times"))
    figures["file_bytes"] = path.stat().st_size
    return figures


def main(argv: list[str]) -> int:
    """Prints a Markdown table of load time and memory per model."""
    from zoo import reference_models

    paths = [Path(p) for p in argv] or reference_models()
    print("| model | file MB | load ms (median) | peak RSS growth MB | tracemalloc peak MB | RSS growth / file |")
    print("|---|---|---|---|---|---|")
    for path in paths:
        f = measure(path)
        mb = 1 / 2**20
        print(
            f"| {path.name} | {f['file_bytes'] * mb:.1f} | {f['median_s'] * 1e3:.1f} | "
            f"{f['peak_rss_growth'] * mb:.1f} | {f['heap_peak'] * mb:.1f} | "
            f"{f['peak_rss_growth'] / f['file_bytes']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
