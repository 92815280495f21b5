"""What `fuse --measure` and `fuse --autoschedulers` time on this host: each block's kernel against
LiteRT + XNNPACK on the same nodes (and which schedule source is fastest), cached on disk by kernel
identity, and the whole fused model under each default claim policy."""

from __future__ import annotations

from pathlib import Path

from fusion.cost import default_cache_dir
from halide_gen.aot import generator_digest
from halide_gen.profile import choose_schedule, jit_kernel, schedule_sources, time_block

from .bench import benchmark
from .model.atomic import load_json_table, save_json_table


# The thread count `fuse --measure` times the policies at besides one: the default policy the bundle
# holds for every interpreter with more than one thread. Two is what a phone app asks for most and
# what every host here has; claiming only the blocks measured faster at one thread can lose at two
# (each block left to TFLite splits the partitions, and with them the work two threads share).
MEASURED_THREADS = 2


def best_default_claim(model: Path, library: Path, threads: int) -> tuple[str, dict[str, float]]:
    """Times the whole fused model with XNNPACK alone and with the delegate claiming all / the
    profitable blocks (interleaved, at `threads` threads) and returns the fastest policy ("none"
    when XNNPACK alone wins: the delegate then claims nothing unless asked) and the medians in ms.
    Per-block measurements cannot see a model's cold caches or the cost of splitting XNNPACK's
    partitions."""
    timings = benchmark(str(model), str(library), threads=threads, runs=15, warmup=2)
    medians = {t.name: t.median / 1e3 for t in timings}
    policy = {"xnnpack": "none", "dnnfusion-all": "all", "dnnfusion-profitable": "profitable"}
    best = min(policy, key=lambda name: medians[name])
    return policy[best], {policy[name]: medians[name] for name in policy}


class BlockTimings:
    """Per-block measurements on this host, cached on disk by kernel identity: which schedule
    source is fastest, and Halide / (LiteRT + XNNPACK) under a source, at one thread."""

    def __init__(self, cache_dir: Path | None):
        self.path = Path(cache_dir or default_cache_dir()) / "block-timings.json"
        self.table = load_json_table(self.path)

    @staticmethod
    def _key(kind: str, *parts: str) -> str:
        # Measurements die with the code generator that made the kernels they timed.
        return ":".join([kind, generator_digest(), *parts])

    def best_schedule(self, identity: str, block, ops, target: str = "host") -> str:
        """The fastest of the templates and Halide's autoschedulers for the block (of kernel
        `identity`) on `target`."""
        key = self._key("schedule", target, identity)
        # A value that is not one of the sources is a damaged table: measure again.
        if self.table.get(key) not in schedule_sources(target):
            inputs = [t for t in block.inputs if not t.is_constant]
            self.table[key] = choose_schedule(ops, block.outputs, inputs, target=target).best
        return str(self.table[key])

    def ratio(self, identity: str, block, ops, schedule: str) -> float:
        """Halide (under `schedule`) / (LiteRT + XNNPACK) on the block's nodes (of kernel `identity`)."""
        key = self._key("ratio", identity, schedule)
        value = self.table.get(key)
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            kernel = jit_kernel(block.name, ops, block.outputs, schedule)
            self.table[key] = time_block(ops, block.inputs, block.outputs, kernel).ratio
        return float(self.table[key])

    def save(self) -> None:
        """Writes the cache; a read-only cache location is skipped."""
        save_json_table(self.path, self.table)
