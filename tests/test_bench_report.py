"""bench/run.py's report: the Markdown section, its replacement in RESULTS.md, and the charts —
from made-up rows (no timing here)."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import run as bench_run  # noqa: E402 - bench/ is not a package

ENV = {"date": "2026-11-30", "cpu": "Test CPU", "cores": "2", "python": "3.11", "ai-edge-litert": "2.3.0",
       "halide": "21", "numpy": "2"}


def row(name: str, tvm: dict | None = None) -> dict:
    def contender(ms: float, ratio: float) -> dict:
        return {"median_ms": ms, "min_ms": ms * 0.9, "max_ms": ms * 1.2, "ratio": ratio, "peak_mib": 40.0}

    timings = {"xnnpack": contender(10.0, 1.0), "builtin": contender(30.0, 3.0),
               "dnnfusion-all": contender(8.0, 0.8), "dnnfusion-profitable": contender(9.0, 0.9)}
    return {"model": name, "ops": 100, "kernels": 40, "blocks": 50, "profitable": 30,
            "activations_before": 8 * 2**20, "activations_after": 4 * 2**20, "fuse_cold_s": 31.0, "fuse_warm_s": 1.5,
            "t1": timings, "t1_cold": {**timings, "xnnpack": contender(12.0, 1.0), "dnnfusion-all": contender(11.0, 0.92)},
            "t2": timings, "tvm_kernels": 60, "tvm": tvm or {},
            "arm64": {"xnnpack": {"insns": 100e6, "mems": 40e6, "cycles": 50e6},
                      "dnnfusion-all": {"insns": 90e6, "mems": 36e6, "cycles": 40e6},
                      "dnnfusion-profitable": {"insns": 95e6, "mems": 38e6}}}


def test_section_has_every_figure():
    text = bench_run.format_results([row("m1", {"median_ms": 20.0}), row("m2", {"error": "frontend: boom"})], ENV,
                                    "python bench/run.py")
    assert text.startswith(bench_run.BEGIN) and text.rstrip().endswith(bench_run.END)
    assert "Test CPU" in text and "ai-edge-litert 2.3.0" in text and "2026-11-30" in text
    assert "| m1 | 10.00 (9.00-12.00) | 3.00x | 0.80x | 0.90x | 12.00, 0.92x | 20.00 (2.00x) |" in text
    assert "| n/a (below) |" in text and "- TVM could not run m2: frontend: boom" in text
    assert "| m1 | 100 | 40 (30) | 60 | 2.00 / 1.67 | 40 / 40 / 40 / 40 | 8.0 / 4.0 | 31 / 1.5 |" in text
    # Cycles beside instructions, and "-" where a contender has none (LLVM absent).
    assert "| m1 | 100.0 | 50.0 | 40.0 | 0.900 | 0.800 | 0.900 | 0.950 | - | 0.950 |" in text


def test_section_says_why_arm64_figures_are_missing():
    missing = {**row("m3"), "arm64": {"error": "qemu-user or g++-aarch64-linux-gnu not installed"}}
    text = bench_run.format_results([missing, {**row("m4"), "arm64": None}], ENV, "cmd")
    assert "| m3 | qemu-user or g++-aarch64-linux-gnu not installed |" in text and "| m4 | not measured |" in text


def test_section_replaces_itself_in_results(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Measured results\n\nintro\n")
    bench_run.update_results(results, bench_run.format_results([row("a")], ENV, "cmd"))
    bench_run.update_results(results, bench_run.format_results([row("b")], ENV, "cmd"))
    text = results.read_text()
    assert text.count(bench_run.BEGIN) == 1 and "| b |" in text and "| a |" not in text and "intro" in text


def test_the_committed_results_hold_the_section_bench_run_replaces():
    # Each marker once, begin before end, in RESULTS.md alone: with one of them elsewhere (a history
    # file split off RESULTS.md), bench/run.py would append a second section instead of replacing it.
    text = (REPO / "bench" / "RESULTS.md").read_text()
    assert text.count(bench_run.BEGIN) == 1 and text.count(bench_run.END) == 1
    assert text.index(bench_run.BEGIN) < text.index(bench_run.END)
    assert bench_run.BEGIN not in (REPO / "bench" / "RESULTS-history.md").read_text()


def test_charts_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    paths = bench_run.draw_charts([row("m1", {"median_ms": 20.0}), row("m2")], tmp_path)
    assert [p.name for p in paths] == ["speedup.png", "fusion.png", "memory.png", "arm64.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
