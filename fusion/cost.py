"""Cost sources the planner asks about yellow Table 3 cells, and their on-disk cache.

A yellow cell fuses only if latency(block + op) <= latency(block) + latency(op) (Listing 1,
step 2.3). Latency comes from a `CostSource`. The default is a static roofline model; the
host-timing profiler (the code-generation stage) plugs into the same interface. Answers are cached
on disk by block signature, so a repeated block (a transformer layer) is costed once per machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

from tflite_tools.model.atomic import load_json_table, save_json_table
from tflite_tools.model.stats import flops as mac_flops

from .ecg import ECG, Node
from .mapping import MtM, OtO
from .signature import block_signature


class CostSource(Protocol):
    """Something that can estimate how long a set of ops takes when run as one fused kernel."""

    name: str

    def latency(self, ecg: ECG, ops: frozenset[int]) -> float:
        """Seconds for `ops` (node indices of `ecg`) run as one kernel."""
        ...


# Elementwise ops whose per-element cost is a transcendental or a division (vs one add/mul).
_EXPENSIVE = {"EXP", "LOG", "LOGISTIC", "TANH", "GELU", "SIN", "COS", "POW", "SQRT", "RSQRT", "DIV",
              "SOFTMAX", "LOG_SOFTMAX", "HARD_SWISH"}


def node_flops(node: Node) -> int:
    """Arithmetic of one op: 2 x MACs for convolutions and products; per element otherwise."""
    heavy = mac_flops(node.op)
    if heavy:
        return heavy
    if node.mapping == MtM:  # reductions, pooling, softmax: one op per input element read
        return sum(t.num_elements for t in node.op.inputs if t is not None and not t.is_constant)
    if node.mapping == OtO and node.op.outputs:
        per = 8 if node.name in _EXPENSIVE else 1
        return per * sum(t.num_elements for t in node.op.outputs)
    return 0  # data movement


def _reuse(node: Node) -> float:
    """How many times a Many-to-Many op reads each element of its main input."""
    x = node.op.inputs[0] if node.op.inputs else None
    if x is None or x.is_constant or not x.num_elements:
        return 1.0
    return max(1.0, mac_flops(node.op) / 2 / x.num_elements)


@dataclass(frozen=True)
class Machine:
    """The roofline's machine. Defaults: one core of this project's x86 host.

    Measured there (an AVX-512 EPYC core): ~115 GFLOP/s fp32 peak, XNNPACK's convolutions at
    70-105, a fused Halide kernel near 100. 12 GB/s is one core's streaming bandwidth;
    2 us is the per-kernel cost of a TFLite node or a Halide pipeline call with its buffer setup.
    """

    flops_per_s: float = 100e9
    bytes_per_s: float = 12e9
    kernel_overhead_s: float = 2e-6


class RooflineCost:
    """Static cost: max(compute, memory traffic) plus a per-kernel overhead.

    Traffic is what enters and leaves the block (inputs, weights, outputs that are still needed);
    intermediates the block keeps inside cost nothing. An elementwise producer inlined into a
    Many-to-Many consumer is recomputed once per read, which is where fusing can lose; a
    Many-to-Many producer is computed once, at the consumer's tiles (a ring buffer in Halide).
    """

    name = "roofline-v1"

    def __init__(self, machine: Machine = Machine()):
        self.machine = machine

    def latency(self, ecg: ECG, ops: frozenset[int]) -> float:
        """Seconds for `ops` as one kernel under the roofline."""
        flops = 0.0
        for i in ops:
            node = ecg.nodes[i]
            work = node_flops(node)
            recompute = 1.0
            if node.mapping != MtM:  # a Many-to-Many producer is computed at the consumer's tiles, once
                consumers = [c for t in node.op.outputs for c in ecg.consumers.get(id(t), []) if c in ops]
                recompute = max((_reuse(ecg.nodes[c]) for c in consumers if ecg.nodes[c].mapping == MtM), default=1.0)
            flops += work * recompute
        traffic = sum(t.nbytes for t in external_inputs(ecg, ops)) + sum(t.nbytes for t in external_outputs(ecg, ops))
        m = self.machine
        return max(flops / m.flops_per_s, traffic / m.bytes_per_s) + m.kernel_overhead_s


def external_inputs(ecg: ECG, ops: Iterable[int]) -> list:
    """Tensors `ops` read that nothing among them writes (constants included), in first-use order."""
    members = set(ops)
    seen, result = set(), []
    for i in sorted(members):
        for t in ecg.nodes[i].op.inputs:
            if t is not None and id(t) not in seen and ecg.producer.get(id(t)) not in members:
                seen.add(id(t))
                result.append(t)
    return result


def external_outputs(ecg: ECG, ops: Iterable[int]) -> list:
    """Tensors `ops` write that are still needed outside them (or are graph outputs)."""
    members = set(ops)
    return [t for i in sorted(members) for t in ecg.nodes[i].op.outputs if not ecg.ir_removable(t, members)]


def default_cache_dir() -> Path:
    """$DNNFUSION_CACHE_DIR, else $XDG_CACHE_HOME/dnnfusion, else ~/.cache/dnnfusion; absolute,
    since the archiver and linker that read cached kernels run in folders of their own."""
    if os.environ.get("DNNFUSION_CACHE_DIR"):
        return Path(os.environ["DNNFUSION_CACHE_DIR"]).absolute()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return (Path(base) / "dnnfusion").absolute()


class CachedCost:
    """Wraps a cost source with an on-disk cache keyed by block signature.

    The cache is one JSON file per source (`cost-<name>.json`); `save` writes it atomically.
    A corrupt or unreadable cache is ignored (and rewritten), never fatal.
    """

    def __init__(self, source: CostSource, cache_dir: Path | None = None):
        self.source = source
        self.name = source.name
        self.path = (cache_dir or default_cache_dir()) / f"cost-{source.name}.json"
        self.hits = self.misses = 0
        try:
            self.table: dict[str, float] = {k: float(v) for k, v in load_json_table(self.path).items()}
        except (ValueError, TypeError):
            self.table = {}
        self._dirty = False

    def latency(self, ecg: ECG, ops: frozenset[int]) -> float:
        """The cached latency of `ops`, asking the wrapped source on a miss."""
        key = block_signature(ecg, ops)
        if key in self.table:
            self.hits += 1
            return self.table[key]
        self.misses += 1
        value = self.source.latency(ecg, ops)
        self.table[key] = value
        self._dirty = True
        return value

    def save(self) -> None:
        """Writes new answers to disk; a read-only cache location is silently skipped."""
        if self._dirty and save_json_table(self.path, self.table):
            self._dirty = False


def profitable(cost: CostSource, ecg: ECG, block: frozenset[int], candidate: int) -> bool:
    """Listing 1 step 2.3: fuse only if it is no slower than running the two apart."""
    joined = cost.latency(ecg, block | {candidate})
    return joined <= cost.latency(ecg, block) + cost.latency(ecg, frozenset({candidate}))
