"""`tflite_tools bench MODEL [--delegate LIB]`: latency side by side.

Contenders (those that apply):

    xnnpack               LiteRT with XNNPACK (the default a user gets)
    builtin               LiteRT's builtin kernels, no delegate
    dnnfusion-all         our delegate claiming every block it has a kernel for (XNNPACK takes the rest)
    dnnfusion-profitable  our delegate claiming only the blocks `fuse --measure` found faster

Repetitions are interleaved, so drift in the machine's speed hits every contender alike: the contenders
take turns, each running a batch of BATCH invokes per turn after one untimed invoke that settles its
caches, in orders where each contender runs right after every other equally often (`balanced_orders`):
in a fixed rotation the contender after LiteRT's builtin kernels always followed them, and at two
threads that alone made it a third slower. Timed so, a contender runs as benchmark_model runs a model,
one invoke after another: its weights and code stay in cache as far as they fit, as they do in an app
that runs one model on every frame. `cold` times the other regime: one invoke per turn, so each follows
another model's and finds the caches full of that model's data. At one thread the contenders share one
process; with more, each runs in a process of its own, every other contender's process stopped (SIGSTOP)
meanwhile. Thread pools keep spinning after an invoke (XNNPACK's; the builtin kernels' for longer than
0.2 s), and any one left running shares the cores with the contender being timed, and with the builtin
contender's process merely idle beside it, XNNPACK's own time at two threads doubled.
Each contender also gets benchmark_model's own lines, with its fields and precision (`count=50
first=... curr=... min=... max=... avg=... std=... p5=... median=... p95=...` in microseconds, and
`Inference timings in us: Init: ..., First inference: ..., Warmup (avg): ..., Inference (avg): ...`).
TFLite's C++ `benchmark_model` itself is not packaged where this project can reach it (no PyPI wheel
carries it); `bench` reproduces its figures for each contender side by side.
Peak memory (`--memory`) is measured per contender in a fresh process: the growth of peak resident
memory from before the interpreter is built to after one inference.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import platform
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
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

    @property
    def mean(self) -> float:
        """Mean inference time."""
        return statistics.fmean(self.runs_us)

    @property
    def std(self) -> float:
        """Standard deviation of the inference times (population, as benchmark_model's Stat)."""
        return statistics.pstdev(self.runs_us)

    def percentile(self, p: int) -> float:
        """The p-th percentile of the inference times (p in 1..99)."""
        if len(self.runs_us) < 2:
            return self.runs_us[0]
        return statistics.quantiles(self.runs_us, n=100, method="inclusive")[p - 1]

    def benchmark_model_lines(self) -> list[str]:
        """The figures as benchmark_model prints them: its Stat line over the timed runs (integer
        microseconds, the average as C++ streams a double), and its summary line."""
        runs = self.runs_us
        stats = (f"count={len(runs)} first={int(runs[0])} curr={int(runs[-1])} min={int(min(runs))} "
                 f"max={int(max(runs))} avg={self.mean:g} std={int(round(self.std))} p5={int(self.percentile(5))} "
                 f"median={int(self.percentile(50))} p95={int(self.percentile(95))}")
        warm = statistics.fmean(self.warmup_us) if self.warmup_us else 0.0
        return [stats, f"Inference timings in us: Init: {self.init_us:g}, First inference: {self.first_us:g}, "
                       f"Warmup (avg): {warm:g}, Inference (avg): {self.mean:g}"]


def ratios(timings: Sequence[Timings], baseline: str = BASELINE) -> dict[str, float]:
    """Each contender's median over the baseline's median (< 1: faster than the baseline)."""
    base = next((t for t in timings if t.name == baseline), None)
    if base is None:
        raise ValueError(f"no {baseline} contender to compare with")
    return {t.name: t.median / base.median for t in timings}


# Timed invokes a contender runs per turn (after one untimed), unless timed cold.
BATCH = 10


@dataclass(frozen=True)
class Contender:
    """One contender: a model under a LiteRT op resolver, with our delegate library claiming
    `claim` (None: no delegate of ours, unless `options` are given) and any further `options`."""

    name: str
    model: str
    resolver: str = "xnnpack"
    delegate: str | None = None
    claim: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    def interpreter(self, threads: int) -> Any:
        """The contender's allocated interpreter at `threads` threads."""
        delegates = []
        if self.claim is not None or self.options:
            options = {"num_threads": str(threads), "log_level": "error", **dict(self.options)}
            if self.claim is not None:
                options["claim"] = self.claim
            delegates.append(runtime.load_delegate(os.fspath(self.delegate), options=options))
        return runtime.make_interpreter(self.model, self.resolver, threads, delegates=delegates)


def contenders(model: str, delegate: str | None, options: dict[str, str] | None = None,
               report: os.PathLike | None = None) -> list[Contender]:
    """The contenders that apply to a model (and our delegate library, when given: claiming all,
    and claiming the profitable blocks; with `options`, one contender taking exactly those). With
    `report`, our contenders append their claims there."""
    cases = [Contender("xnnpack", model), Contender("builtin", model, "builtin")]
    extra = (("report", os.fspath(report)),) if report is not None else ()
    if delegate is not None and options is not None:
        cases.append(Contender("dnnfusion", model, delegate=delegate, options=tuple(options.items()) + extra))
    elif delegate is not None:
        cases += [Contender("dnnfusion-all", model, delegate=delegate, claim="all", options=extra),
                  Contender("dnnfusion-profitable", model, delegate=delegate, claim="profitable", options=extra)]
    return cases


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1e6


@dataclass(frozen=True)
class Inputs:
    """What every contender is fed: .npy files, one per model input, else seeded random arrays
    (runtime.model_inputs, as `run` feeds a model); `shapes`, one per input, resize the model's
    inputs first (benchmark_model's --input_layer_shape)."""

    paths: tuple[str, ...] = ()
    seed: int = 0
    shapes: tuple[tuple[int, ...], ...] = ()

    def set(self, interp: Any) -> None:
        """Resizes the interpreter's inputs where `shapes` say, then sets them."""
        if self.shapes:
            details = interp.get_input_details()
            if len(self.shapes) != len(details):
                raise ModelError(f"--input_layer_shape names {len(self.shapes)} shapes; the model has "
                                 f"{len(details)} inputs")
            for detail, dims in zip(details, self.shapes):
                interp.resize_tensor_input(detail["index"], list(dims))
            try:
                interp.allocate_tensors()
            except (RuntimeError, ValueError) as exc:
                raise ModelError(f"LiteRT cannot run the model at --input_layer_shape {self.shapes}: {exc}") from None
        for detail, value in zip(interp.get_input_details(), runtime.model_inputs(interp, self.paths, self.seed)):
            interp.set_tensor(detail["index"], value)


def _prepared(case: Contender, threads: int, inputs: Inputs) -> tuple[Any, Timings]:
    """The contender's interpreter with its inputs set, after one (timed) inference."""
    try:
        interp, init = _timed(lambda: case.interpreter(threads))
    except (ValueError, RuntimeError) as exc:
        raise ModelError(f"{case.model}: {case.name} cannot run the model: {exc}") from None
    inputs.set(interp)
    _, first = _timed(interp.invoke)
    return interp, Timings(case.name, init, first)


def benchmark(model: str, delegate: str | None = None, threads: int = 1, runs: int = 50, warmup: int = 5,
              progress: Callable[[int, int, str], None] | None = None, inputs: Inputs = Inputs(),
              cold: bool = False, options: dict[str, str] | None = None,
              report: os.PathLike | None = None) -> list[Timings]:
    """Times every contender on the same inputs, interleaved (see the module's docstring; `cold`:
    each invoke after another contender's; `options`, `report`: `contenders`)."""
    if delegate is not None:
        check_unchanged(delegate)
        check_delegate_library(delegate)
    return time_contenders(contenders(model, delegate, options, report), threads, runs, warmup, progress, inputs,
                           cold=cold)


def time_contenders(cases: Sequence[Contender], threads: int = 1, runs: int = 50, warmup: int = 5,
                    progress: Callable[[int, int, str], None] | None = None, inputs: Inputs = Inputs(),
                    isolated: bool | None = None, cold: bool = False) -> list[Timings]:
    """Times `cases` interleaved, taking turns (see the module's docstring): in one process, or
    (`isolated`; by default with more than one thread) each in a process of its own. `cold`: one
    invoke per turn, each after another contender's."""
    if isolated if isolated is not None else threads > 1:
        return _time_isolated(cases, threads, runs, warmup, progress, inputs, cold)
    prepared = [_prepared(case, threads, inputs) for case in cases]

    def batch(k: int, count: int) -> list[float]:
        invoke = prepared[k][0].invoke
        return [_timed(invoke)[1] for _ in range(count)]

    _take_turns([t for _, t in prepared], batch, runs, warmup, cold, progress)
    return [t for _, t in prepared]


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of n contenders in which each runs right after every other equally often (a Williams
    design): n orders, each the first one shifted (0, 1, n-1, 2, n-2, ...), and their reverses
    too where n is odd. For two contenders, the two rotations."""
    first, low, high = [0], 1, n - 1
    for k in range(1, n):
        if k % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    orders = [[(c + shift) % n for c in first] for shift in range(n)]
    return orders + [order[::-1] for order in orders] if n % 2 else orders


def _take_turns(timings: Sequence[Timings], batch: Callable[[int, int], list[float]], runs: int, warmup: int,
                cold: bool, progress: Callable[[int, int, str], None] | None) -> None:
    """Fills each contender's warm-up and run times, contender k timing `count` invokes per call of
    batch(k, count): in turns of BATCH after one untimed invoke, or (`cold`) of one, each turn in the
    next of `balanced_orders`."""
    total, done, turn = (warmup + runs) * len(timings), 0, 0
    orders = balanced_orders(len(timings))
    while done < total:
        for k in orders[turn % len(orders)]:
            t = timings[k]
            wanted = warmup - len(t.warmup_us) or min(1 if cold else BATCH, runs - len(t.runs_us))
            if wanted <= 0:
                continue
            times = batch(k, wanted if cold else wanted + 1)[0 if cold else 1:]
            for us in times:
                (t.warmup_us if len(t.warmup_us) < warmup else t.runs_us).append(us)
            done += len(times)
        turn += 1
        if progress:
            progress(done, total, f"turn {turn}")


def _serve(conn: Any, case: Contender, threads: int, inputs: Inputs) -> None:
    """A contender's own process: reports its Timings (or a ModelError's message), then answers
    each invoke count it is sent with that many invoke times in microseconds (0 ends it)."""
    try:
        try:
            interp, timings = _prepared(case, threads, inputs)
        except ModelError as exc:
            conn.send(str(exc))
            return
        conn.send(timings)
        while (count := conn.recv()) > 0:
            conn.send([_timed(interp.invoke)[1] for _ in range(count)])
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent is gone (a Ctrl-C as this process started): nothing is left to answer


def _time_isolated(cases: Sequence[Contender], threads: int, runs: int, warmup: int,
                   progress: Callable[[int, int, str], None] | None, inputs: Inputs, cold: bool) -> list[Timings]:
    context = multiprocessing.get_context("spawn")
    started: list[tuple[Any, Any]] = []
    workers: list[tuple[Any, Any, Timings]] = []

    def batch(k: int, count: int) -> list[float]:
        process, conn, t = workers[k]
        os.kill(process.pid, signal.SIGCONT)
        conn.send(count)
        times = _answer(process, conn, t.name)
        os.kill(process.pid, signal.SIGSTOP)
        return times

    try:
        for case in cases:
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, case, threads, inputs), daemon=True)
            _start_deaf_to_ctrl_c(process.start)
            started.append((process, ours))
            theirs.close()  # the child's end: once the child is gone, recv() raises instead of waiting
            reply = _answer(process, ours, case.name)
            if isinstance(reply, str):
                raise ModelError(reply)
            os.kill(process.pid, signal.SIGSTOP)  # its thread pools may still be spinning
            workers.append((process, ours, reply))
        _take_turns([t for _, _, t in workers], batch, runs, warmup, cold, progress)
    finally:
        for process, conn in started:  # every one, answered or not: none may outlive this call
            _end(process, conn)
    return [t for _, _, t in workers]


def _end(process: Any, conn: Any) -> None:
    """Ends a contender's process: asked to stop, then killed if it has not within 10 s (one still
    building its interpreter reads the request once it has answered)."""
    if process.is_alive():
        os.kill(process.pid, signal.SIGCONT)
        try:
            conn.send(0)
        except OSError:
            pass  # it closed its end as it ended
        process.join(timeout=10)
    if process.is_alive():
        process.kill()
        process.join()


def _start_deaf_to_ctrl_c(start: Callable[[], Any]) -> Any:
    """Starts a contender's process with SIGINT ignored (a child Python then installs no
    KeyboardInterrupt handler): Ctrl-C reaches the whole process group, and only this process
    should answer it, ending its children as it unwinds, without a traceback from each."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return start()
    finally:
        signal.signal(signal.SIGINT, previous)


def _answer(process: Any, conn: Any, name: str) -> Any:
    """The contender process's next message; a ModelError if the process died instead (a crash in
    the runtime ends that process, never this one)."""
    try:
        return conn.recv()
    except EOFError:
        process.join(timeout=10)
        raise ModelError(f"{name}: its process ended (exit code {process.exitcode})") from None


def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field_name}")


def _peak_memory_child(model: str, delegate: str | None, threads: int, name: str, inputs: Inputs,
                       options: dict[str, str] | None) -> int:
    """Peak resident growth (KiB) from building the interpreter through one inference."""
    # Reset the high-water mark left by imports (Linux: writing 5 to clear_refs), so the peak
    # read afterwards is this contender's.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = _status_kib("VmRSS")
    interp = next(c for c in contenders(model, delegate, options) if c.name == name).interpreter(threads)
    inputs.set(interp)
    interp.invoke()
    return _status_kib("VmHWM") - before


def measure_peak_memory(timings: Sequence[Timings], model: str, delegate: str | None, threads: int,
                        inputs: Inputs = Inputs(), options: dict[str, str] | None = None) -> None:
    """Fills each contender's peak_memory_kib, measured in a fresh process of its own."""
    context = multiprocessing.get_context("spawn")
    for t in timings:
        with _start_deaf_to_ctrl_c(lambda: context.Pool(1)) as pool:
            t.peak_memory_kib = pool.apply(_peak_memory_child, (model, delegate, threads, t.name, inputs, options))


def format_benchmark(timings: Sequence[Timings], model: str, threads: int, cold: bool = False) -> str:
    """A table (median, min, max, spread, ratio to XNNPACK, memory) and benchmark_model's lines."""
    rel = ratios(timings)
    lines = [f"{model} ({threads} thread{'s' if threads != 1 else ''}, {len(timings[0].runs_us)} interleaved runs"
             f"{', each after another contender' if cold else f' in turns of {BATCH}'}"
             f"{', each contender in its own process' if threads > 1 else ''})",
             "",
             f"{'runtime':<22}{'median ms':>10}{'min ms':>9}{'max ms':>9}{'spread':>8}{'vs xnnpack':>11}{'peak MiB':>10}"]
    for t in timings:
        mem = f"{t.peak_memory_kib / 1024:.1f}" if t.peak_memory_kib is not None else "-"
        lines.append(f"{t.name:<22}{t.median / 1e3:>10.3f}{min(t.runs_us) / 1e3:>9.3f}{max(t.runs_us) / 1e3:>9.3f}"
                     f"{t.spread:>8.1%}{rel[t.name]:>10.2f}x{mem:>10}")
    lines.append("")
    for t in timings:
        lines += [f"[{t.name}] {line}" for line in t.benchmark_model_lines()]
    return "\n".join(lines)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def host_cpu(cpuinfo: str | None = None) -> str:
    """The host CPU's model name (Linux's /proc/cpuinfo, or `cpuinfo`'s text), else what platform
    knows; on x86 with the widest vector extension it exposes, which x86 kernels' speed turns on
    ("AMD EPYC (AVX2, no AVX-512)"): a VM may hide what the model name's CPU has."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for key, _, value in (line.partition(":") for line in cpuinfo.splitlines()):
        fields.setdefault(key.strip(), value.strip())  # the first processor's
    name = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    if "avx512f" in flags:
        return f"{name} (AVX-512)"
    return f"{name} (AVX2, no AVX-512)" if "avx2" in flags else name


def host_line() -> str:
    """The line speed tables print above them: the host CPU (host_cpu) and its core count."""
    return f"Host: {host_cpu()}, {os.cpu_count()} cores."


def benchmark_json(timings: Sequence[Timings], model: str, threads: int, cold: bool = False) -> dict:
    """`bench --json`: per contender the raw samples (us) with their mean, deviation and
    percentiles, benchmark_model's figures and the ratio to XNNPACK; the host and the versions."""
    rel = ratios(timings)
    return {
        "model": model, "threads": threads, "cold": cold,
        "host": {"cpu": host_cpu(), "cores": os.cpu_count(), "machine": platform.machine(),
                 "python": platform.python_version()},
        "versions": {name: _version(name) for name in ("dnnfusion", runtime.RUNTIME.replace("_", "-"), "halide")},
        "contenders": [{
            "name": t.name, "samples_us": t.runs_us, "warmup_us": t.warmup_us, "init_us": t.init_us,
            "first_us": t.first_us, "mean_us": t.mean, "std_us": t.std, "min_us": min(t.runs_us),
            "max_us": max(t.runs_us), "p5_us": t.percentile(5), "median_us": t.median, "p95_us": t.percentile(95),
            "spread": t.spread, "ratio_to_xnnpack": rel[t.name], "peak_memory_kib": t.peak_memory_kib,
            "benchmark_model": t.benchmark_model_lines()} for t in timings]}
