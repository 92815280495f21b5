"""`tflite_tools bench MODEL [--delegate LIB]`: latency side by side, in one process.

Contenders (those that apply):

    xnnpack               LiteRT with XNNPACK (the default a user gets)
    builtin               LiteRT's builtin kernels, no delegate
    dnnfusion-all         our delegate claiming every block it has a kernel for (XNNPACK takes the rest)
    dnnfusion-profitable  our delegate claiming only the blocks `fuse --measure` found faster

Repetitions are interleaved (one invoke of each contender per round), so drift in the machine's
speed hits every contender alike. Each contender also gets benchmark_model's own summary line
(`Inference timings in us: Init: ..., First inference: ..., Warmup (avg): ..., Inference (avg): ...`).
Peak memory (`--memory`) is measured per contender in a fresh process: the growth of peak resident
memory from before the interpreter is built to after one inference.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import runtime
from .model.errors import ModelError
from .outdir import check_unchanged
from .sharedlib import check_delegate_library

BASELINE = "xnnpack"


@dataclass
class Timings:
    """One contender's figures, in microseconds."""

    name: str
    init_us: float
    first_us: float
    warmup_us: list[float] = field(default_factory=list)
    runs_us: list[float] = field(default_factory=list)
    peak_memory_kib: int | None = None

    @property
    def median(self) -> float:
        """Median inference time."""
        return statistics.median(self.runs_us)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0.05 = the middle half within 5%)."""
        if len(self.runs_us) < 4:
            return 0.0
        q = statistics.quantiles(self.runs_us, n=4)
        return (q[2] - q[0]) / self.median

    def benchmark_model_line(self) -> str:
        """The figures as benchmark_model prints them."""
        warm = statistics.fmean(self.warmup_us) if self.warmup_us else 0.0
        return (f"Inference timings in us: Init: {self.init_us:.0f}, First inference: {self.first_us:.0f}, "
                f"Warmup (avg): {warm:.0f}, Inference (avg): {statistics.fmean(self.runs_us):.0f}")


def ratios(timings: Sequence[Timings], baseline: str = BASELINE) -> dict[str, float]:
    """Each contender's median over the baseline's median (< 1: faster than the baseline)."""
    base = next((t for t in timings if t.name == baseline), None)
    if base is None:
        raise ValueError(f"no {baseline} contender to compare with")
    return {t.name: t.median / base.median for t in timings}


def contenders(model: str, delegate: str | None, threads: int) -> dict[str, Callable[[], Any]]:
    """Interpreter factories by contender name."""

    def litert(resolver: str, claim: str | None = None) -> Callable[[], Any]:
        def make() -> Any:
            delegates = []
            if claim is not None:
                delegates.append(runtime.load_delegate(os.fspath(delegate), options={
                    "claim": claim, "num_threads": str(threads), "log_level": "error"}))
            return runtime.make_interpreter(model, resolver, threads, delegates=delegates)
        return make

    makers = {"xnnpack": litert("xnnpack"), "builtin": litert("builtin")}
    if delegate is not None:
        makers["dnnfusion-all"] = litert("xnnpack", "all")
        makers["dnnfusion-profitable"] = litert("xnnpack", "profitable")
    return makers


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1e6


def benchmark(model: str, delegate: str | None = None, threads: int = 1, runs: int = 50, warmup: int = 5,
              progress: Callable[[int, int, str], None] | None = None, seed: int = 0) -> list[Timings]:
    """Times every contender on the same random inputs, interleaved round by round."""
    if delegate is not None:
        check_unchanged(delegate)
        check_delegate_library(delegate)
    makers = contenders(model, delegate, threads)
    interps, results = {}, []
    for name, make in makers.items():
        try:
            interp, init = _timed(make)
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"{model}: {name} cannot run the model: {exc}") from None
        inputs = runtime.random_inputs(interp, seed)
        for detail, value in zip(interp.get_input_details(), inputs):
            interp.set_tensor(detail["index"], value)
        _, first = _timed(interp.invoke)
        interps[name] = interp
        results.append(Timings(name, init, first))
    total = (warmup + runs) * len(interps)
    done = 0
    for round_ in range(warmup + runs):
        for t in results:
            _, us = _timed(interps[t.name].invoke)
            (t.warmup_us if round_ < warmup else t.runs_us).append(us)
            done += 1
        if progress:
            progress(done, total, f"round {round_ + 1}/{warmup + runs}")
    return results


def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field_name}")


def _peak_memory_child(model: str, delegate: str | None, threads: int, name: str) -> int:
    """Peak resident growth (KiB) from building the interpreter through one inference."""
    # Reset the high-water mark left by imports (Linux: writing 5 to clear_refs), so the peak
    # read afterwards is this contender's.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = _status_kib("VmRSS")
    interp = contenders(model, delegate, threads)[name]()
    for detail, value in zip(interp.get_input_details(), runtime.random_inputs(interp)):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return _status_kib("VmHWM") - before


def measure_peak_memory(timings: Sequence[Timings], model: str, delegate: str | None, threads: int) -> None:
    """Fills each contender's peak_memory_kib, measured in a fresh process of its own."""
    context = multiprocessing.get_context("spawn")
    for t in timings:
        with context.Pool(1) as pool:
            t.peak_memory_kib = pool.apply(_peak_memory_child, (model, delegate, threads, t.name))


def format_benchmark(timings: Sequence[Timings], model: str, threads: int) -> str:
    """A table (median, min, max, spread, ratio to XNNPACK, memory) and benchmark_model's lines."""
    rel = ratios(timings)
    lines = [f"{model} ({threads} thread{'s' if threads != 1 else ''}, {len(timings[0].runs_us)} interleaved runs)",
             "",
             f"{'runtime':<22}{'median ms':>10}{'min ms':>9}{'max ms':>9}{'spread':>8}{'vs xnnpack':>11}{'peak MiB':>10}"]
    for t in timings:
        mem = f"{t.peak_memory_kib / 1024:.1f}" if t.peak_memory_kib is not None else "-"
        lines.append(f"{t.name:<22}{t.median / 1e3:>10.3f}{min(t.runs_us) / 1e3:>9.3f}{max(t.runs_us) / 1e3:>9.3f}"
                     f"{t.spread:>8.1%}{rel[t.name]:>10.2f}x{mem:>10}")
    lines.append("")
    for t in timings:
        lines.append(f"[{t.name}] {t.benchmark_model_line()}")
    return "\n".join(lines)
