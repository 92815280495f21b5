"""Static measurements of a graph: FLOPs, weight bytes, activation bytes and their peak live set.

These are the numbers `tflite_tools info` prints and the fusion planner reports before and after
fusing, so they live with the IR rather than with either user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .ir import Model, Operator, Subgraph, Tensor


def _prod(values: tuple[int, ...] | list[int]) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result


def macs(op: Operator) -> int:
    """Multiply-accumulates of the compute-heavy ops (convolutions and matrix products), else 0."""
    name = op.name
    out = op.outputs[0] if op.outputs else None

    def operand(i: int, rank: int) -> Tensor | None:
        # A malformed graph (wrong rank, missing operand) has no defined count: report 0.
        t = op.inputs[i] if i < len(op.inputs) else None
        return t if t is not None and len(t.shape) == rank else None

    if out is None:
        return 0
    if name == "CONV_2D" and (w := operand(1, 4)):  # filter [Cout, kh, kw, Cin/groups]
        return out.num_elements * _prod(w.shape[1:])
    if name == "DEPTHWISE_CONV_2D" and (w := operand(1, 4)):  # filter [1, kh, kw, Cout]
        return out.num_elements * _prod(w.shape[1:3])
    if name == "CONV_3D" and (w := operand(1, 5)):  # filter [kd, kh, kw, Cin, Cout]
        return out.num_elements * _prod(w.shape[:4])
    if name == "TRANSPOSE_CONV" and (w := operand(1, 4)) and (x := operand(2, 4)):
        # Every input pixel scatters a kh x kw x Cout patch: filter [Cout, kh, kw, Cin].
        return x.num_elements * _prod(w.shape[:3])
    if name == "FULLY_CONNECTED" and (w := operand(1, 2)):  # weights [units, in]
        return out.num_elements * int(w.shape[1])
    if name == "BATCH_MATMUL" and op.inputs and op.inputs[0] is not None and len(op.inputs[0].shape) >= 2:
        lhs = op.inputs[0]
        k = lhs.shape[-2] if getattr(op.options, "adjX", False) else lhs.shape[-1]
        return out.num_elements * int(k)
    return 0


def flops(op: Operator) -> int:
    """FLOPs as 2 x MACs for convolutions and matrix products; other ops count 0."""
    return 2 * macs(op)


def weight_bytes(model: Model) -> int:
    """Bytes of constant data, counting memory shared by several tensors once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for sg in model.subgraphs:
        for t in sg.tensors:
            if t.data is not None:
                key = (t.data.__array_interface__["data"][0], t.data.nbytes)
                if key not in seen:
                    seen.add(key)
                    total += int(t.data.nbytes)
    return total


@dataclass(frozen=True)
class Lifetime:
    """A non-constant tensor is live from step `first` to step `last`, inclusive.

    Step -1 is before the first operator (graph inputs); step len(operators) is after the last
    (graph outputs must survive the whole run).
    """

    tensor: Tensor
    first: int
    last: int


@dataclass(frozen=True)
class Step:
    """One unit of execution for lifetime analysis: an operator, or a fused block of them."""

    inputs: Sequence[Tensor | None]
    outputs: Sequence[Tensor]


def lifetimes(sg: Subgraph, steps: Sequence[Step] | None = None) -> list[Lifetime]:
    """The lifetime of every non-constant tensor the steps or the subgraph's interface touch.

    `steps` defaults to the subgraph's operators; a fusion plan passes its blocks instead, so
    tensors internal to a block never appear.
    """
    if steps is None:
        steps = [Step(op.inputs, op.outputs) for op in sg.operators]
    end = len(steps)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    tensors: dict[int, Tensor] = {}

    def touch(t: Tensor, step: int) -> None:
        if t.is_constant:
            return
        key = id(t)
        tensors[key] = t
        first[key] = min(first.get(key, step), step)
        last[key] = max(last.get(key, step), step)

    for t in sg.inputs:
        touch(t, -1)
    for index, step in enumerate(steps):
        for t in step.inputs:
            if t is not None:
                if id(t) not in first:
                    # Read before anything in the graph writes it (a variable, or an input the
                    # graph does not list): it must exist from the start.
                    touch(t, -1)
                touch(t, index)
        for t in step.outputs:
            touch(t, index)
    for t in sg.outputs:
        touch(t, end)
    for t in sg.tensors:
        if t.is_variable and not t.is_constant:
            touch(t, -1)
            touch(t, end)
    return [Lifetime(tensors[k], first[k], last[k]) for k in tensors]


def activation_bytes(sg: Subgraph, steps: Sequence[Step] | None = None) -> int:
    """Bytes of all non-constant tensors the steps touch, as if each had its own buffer."""
    return sum(lt.tensor.nbytes for lt in lifetimes(sg, steps))


def peak_live_bytes(sg: Subgraph, steps: Sequence[Step] | None = None) -> int:
    """The largest total size of tensors live at once, under the lifetime plan above.

    This is the floor for any arena that reuses memory by lifetime (TFLite's arena planner
    lands near it; fragmentation can add a little).
    """
    spans = lifetimes(sg, steps)
    if not spans:
        return 0
    count = (len(sg.operators) if steps is None else len(steps)) + 2  # -1 .. len(steps)
    delta = np.zeros(count + 1, dtype=np.int64)
    for lt in spans:
        delta[lt.first + 1] += lt.tensor.nbytes
        delta[lt.last + 2] -= lt.tensor.nbytes
    return int(np.cumsum(delta).max())


def human_bytes(n: int) -> str:
    """`13.3 MiB`-style size."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
