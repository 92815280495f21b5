"""The host profiler: a block's Halide kernel timed against LiteRT + XNNPACK on the same nodes,
and the choice between schedule sources (templates or autoschedulers) by timing them.

The block's ops are cut out into a small `.tflite` (its inputs become graph inputs, its weights
stay constants), LiteRT runs that with XNNPACK, Halide runs the block's JIT kernel, both on the same
random inputs, in interleaved rounds; the figure is the median over rounds. As a `CostSource` it
answers the planner's yellow cells with measured latencies (cache it with fusion.cost.CachedCost).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import halide as hl
import numpy as np

import tflite_tools
from fusion.cost import external_inputs, external_outputs
from fusion.ecg import ECG
from tflite_tools import runtime
from tflite_tools.model.ir import Model, Operator, Signature, Subgraph, Tensor, with_referenced

from .aot import generator_digest
from .block import build_block, build_block_for
from .jit import JitKernel
from .schedule import is_template, schedule_for, schedule_from, template_sources
from .schedule.auto import CPU_AUTOSCHEDULERS, GPU_AUTOSCHEDULERS
from .targets import VULKAN_ALLOC_CONFIG, target_spec


def cut_out(ops: Sequence[Operator], inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> Model:
    """A model holding just `ops`: `inputs` become graph inputs, constants stay constants."""
    tensors = with_referenced(t for op in ops for t in (*op.inputs, *op.outputs))
    graph = Subgraph(tensors=tensors, operators=list(ops), inputs=list(inputs), outputs=list(outputs))
    sig = Signature("block", 0, {t.name: t for t in inputs}, {t.name: t for t in outputs})
    return Model(subgraphs=[graph], signatures=[sig], description="dnnfusion block cut-out")


def random_array(t: Tensor, rng: np.random.Generator) -> np.ndarray:
    """Random data for a tensor: normal floats, small non-negative integers (indices), coin flips."""
    dtype = t.numpy_dtype
    if dtype is None:
        raise ValueError(f"cannot make data for {t.type_name}")
    if dtype.kind == "f":
        return rng.standard_normal(t.shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, t.shape).astype(np.bool_)
    return rng.integers(0, 8, t.shape).astype(dtype)


@dataclass
class Timing:
    """Median seconds of each contender, and the per-round ratio halide / litert."""

    halide_s: float
    litert_s: float
    ratio: float


def _time(fn: Callable[[], None], min_seconds: float) -> float:
    """Seconds per call of `fn`, repeating until `min_seconds` have passed (at least 3 calls)."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if calls >= 3 and elapsed >= min_seconds:
            return elapsed / calls


def interleaved_seconds(fns: Sequence[Callable[[], None]], rounds: int = 7,
                        min_seconds: float = 0.02) -> list[list[float]]:
    """Seconds per call of each of `fns`, timed in turns for `rounds` rounds (so that a slow
    spell of the machine falls on every contender alike): one list of per-round seconds per fn."""
    seconds: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, own in zip(fns, seconds):
            own.append(_time(fn, min_seconds))
    return seconds


def block_contenders(ops: Sequence[Operator], inputs: Sequence[Tensor], outputs: Sequence[Tensor], kernel: JitKernel,
                     threads: int = 1, seed: int = 0) -> tuple[Callable[[], None], Callable[[], None]]:
    """`kernel` and LiteRT + XNNPACK on the cut-out ops, both bound to the same random inputs and
    run once (first calls allocate and page in): two callables that run each once more."""
    rng = np.random.default_rng(seed)
    data = {id(t): random_array(t, rng) for t in inputs}
    interp = runtime.make_interpreter(tflite_tools.serialize(cut_out(ops, inputs, outputs)), "xnnpack", threads)
    for detail, t in zip(interp.get_input_details(), inputs):
        interp.set_tensor(detail["index"], data[id(t)])
    kernel.bind(kernel.inputs_from(data))
    interp.invoke()
    kernel.run()
    return kernel.run, interp.invoke


def time_block(ops: Sequence[Operator], inputs: Sequence[Tensor], outputs: Sequence[Tensor], kernel: JitKernel,
               rounds: int = 7, min_seconds: float = 0.02, threads: int = 1, seed: int = 0) -> Timing:
    """Times `kernel` against LiteRT + XNNPACK on the cut-out ops, in interleaved rounds."""
    contenders = block_contenders(ops, inputs, outputs, kernel, threads, seed)
    halide, litert = interleaved_seconds(list(contenders), rounds, min_seconds)
    ratios = [h / lt for h, lt in zip(halide, litert)]
    return Timing(statistics.median(halide), statistics.median(litert), statistics.median(ratios))


@dataclass
class ScheduleChoice:
    """The fastest schedule source for a block, and every candidate's median seconds."""

    best: str
    seconds: dict[str, float]


def _kernel_seconds(kernel: JitKernel, inputs: Sequence[Tensor], min_seconds: float, seed: int = 0) -> float:
    """Median seconds per run of a JIT kernel on random data for its (non-constant) inputs."""
    rng = np.random.default_rng(seed)
    kernel.bind(kernel.inputs_from({id(t): random_array(t, rng) for t in inputs}))
    kernel.run()  # warm: the first call allocates
    return statistics.median(_time(kernel.run, min_seconds) for _ in range(3))


def jit_kernel(name: str, ops: Sequence[Operator], outputs: Sequence[Tensor], source: str = "template",
               target: str = "host") -> JitKernel:
    """The block JIT-compiled to run here for `target` (this host's CPU, or its OpenCL / Vulkan
    device for host-opencl / host-vulkan) under a schedule source: "template" (the target's
    schedule family), a variant of it (schedule.TEMPLATE_VARIANTS) or the name of one of Halide's
    autoschedulers."""
    spec = target_spec(target)
    if spec.gpu_api == "vulkan":  # the allocator settings the delegate uses (aot.VULKAN_ALLOC_CONFIG)
        os.environ.setdefault("HL_VK_ALLOC_CONFIG", VULKAN_ALLOC_CONFIG)
    jit = spec.jit_target()
    kernel = build_block_for(spec, name, ops, outputs)
    return JitKernel(kernel, target=jit, schedule=lambda k: schedule_from(k, spec, source, jit))


def schedule_sources(target: str) -> tuple[str, ...]:
    """What `choose_schedule` compares for a target: the templates, their variants
    (schedule.TEMPLATE_VARIANTS) and the autoschedulers of its family (Adams2019, Mullapudi2016,
    Li2018 on CPUs; Anderson2021, Li2018 on GPUs)."""
    family = target_spec(target).family
    return template_sources(family) + (GPU_AUTOSCHEDULERS if family == "gpu" else CPU_AUTOSCHEDULERS)


# How much faster than the templates' defaults another schedule source must time on a block cut out
# to replace them. A cut-out block's timing moves by a few percent from run to run, and inside a
# model (other blocks' data in the caches) the difference can turn, and a whole model lost where
# every block took its fastest source with no margin.
CHOICE_MARGIN = 0.05


def choose_schedule(ops: Sequence[Operator], outputs: Sequence[Tensor], inputs: Sequence[Tensor],
                    sources: Sequence[str] | None = None, min_seconds: float = 0.01, seed: int = 0,
                    target: str = "host") -> ScheduleChoice:
    """Times the block's kernel under each schedule source ("template" = the hand-written
    templates, a variant of them, or an autoscheduler's name; default: schedule_sources(target))
    where `target`'s kernels run here, and returns the fastest, unless it beats the templates'
    defaults by less than CHOICE_MARGIN: then the defaults."""
    seconds = {}
    for source in sources or schedule_sources(target):
        try:
            kernel = jit_kernel(f"choose_{source}", ops, outputs, source, target)
        except hl.HalideError:
            # An autoscheduler's schedule the target cannot compile (Anderson2021 and Li2018 may
            # index with 64-bit integers, which Vulkan lacks here) is no candidate; a template
            # that fails is a bug and says so.
            if is_template(source):
                raise
            seconds[source] = float("inf")
            continue
        seconds[source] = _kernel_seconds(kernel, inputs, min_seconds, seed)
    best = min(seconds, key=seconds.get)
    if "template" in seconds and seconds[best] > (1 - CHOICE_MARGIN) * seconds["template"]:
        best = "template"
    return ScheduleChoice(best, seconds)


class HostProfiler:
    """A CostSource that times each asked-about block's Halide kernel on this machine. Its name,
    which keys its on-disk cache (fusion.cost.CachedCost), carries the code generator's digest:
    timings die with the code that made the kernels they timed."""

    def __init__(self, threads: int = 1, min_seconds: float = 0.01):
        self.name = f"host-profiler-{generator_digest()}"
        self.threads = threads
        self.min_seconds = min_seconds
        os.environ.setdefault("HL_NUM_THREADS", str(threads))

    def latency(self, ecg: ECG, ops: frozenset[int]) -> float:
        """Median seconds of the ops as one Halide kernel (plus nothing: launch cost is inside)."""
        members = sorted(ops)
        jit = hl.get_jit_target_from_environment()
        # The templates for this CPU's vector extension, as the host library's build for it has.
        kernel = JitKernel(build_block("profile", [ecg.nodes[i].op for i in members], external_outputs(ecg, members)),
                           target=jit, schedule=lambda k: schedule_for(k, target_spec("host"), "template", jit))
        inputs = [t for t in external_inputs(ecg, members) if not t.is_constant]
        return _kernel_seconds(kernel, inputs, self.min_seconds)
