"""`tflite_tools info`: what a model is, in one screen (or one JSON object)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .model import stats
from .model.ir import Model, Operator, Tensor

# Operators that run other subgraphs.
CONTROL_FLOW = frozenset({"WHILE", "IF", "CALL_ONCE", "CALL"})


def op_label(op: Operator) -> str:
    """The op's name with its fused activation, as the histogram shows it (`CONV_2D+RELU6`)."""
    act = op.fused_activation
    return f"{op.name}+{act}" if act else op.name


def _tensor_entry(name: str, t: Tensor) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "tensor": t.name,
        "dtype": t.type_name,
        "shape": list(t.shape),
    }
    if t.shape_signature is not None:
        entry["shape_signature"] = list(t.shape_signature)
    q = t.quantization
    if q is not None and q.scale is not None and q.scale.size:
        entry["quantization"] = {
            "scale": [float(s) for s in q.scale[:8]],
            "zero_point": [int(z) for z in (q.zero_point[:8] if q.zero_point is not None else [])],
            "per_channel": q.per_channel,
        }
    if t.is_dynamic:
        entry["dynamic"] = True
    return entry


def _interface(model: Model) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Inputs and outputs by signature names where the model has a signature, else by tensor."""
    if model.signatures:
        sig = model.signatures[0]
        return (
            [_tensor_entry(n, t) for n, t in sig.inputs.items()],
            [_tensor_entry(n, t) for n, t in sig.outputs.items()],
        )
    main = model.main
    return [_tensor_entry(t.name, t) for t in main.inputs], [_tensor_entry(t.name, t) for t in main.outputs]


def model_info(model: Model) -> dict[str, Any]:
    """Everything `info` reports, as plain JSON-ready data.

    Operator counts, the histogram, tensors and FLOPs cover every subgraph once (a WHILE body is
    counted for one iteration); activation bytes and the peak live set are per subgraph, and the
    top-level peak is the entry subgraph's.
    """
    histogram: Counter[str] = Counter()
    custom_ops: set[str] = set()
    subgraphs = []
    for si, sg in enumerate(model.subgraphs):
        for op in sg.operators:
            histogram[op_label(op)] += 1
            if op.opcode.is_custom:
                custom_ops.add(op.opcode.custom_code or "")
        subgraphs.append(
            {
                "index": si,
                "name": sg.name,
                "operators": len(sg.operators),
                "tensors": len(sg.tensors),
                "activation_bytes": stats.activation_bytes(sg),
                "peak_activation_bytes": stats.peak_live_bytes(sg),
                "flops": sum(stats.flops(op) for op in sg.operators),
            }
        )
    dynamic = sorted({t.name for sg in model.subgraphs for t in sg.tensors if t.is_dynamic})
    inputs, outputs = _interface(model)
    return {
        "description": model.description,
        "schema_version": model.version,
        "signatures": [s.key for s in model.signatures],
        "inputs": inputs,
        "outputs": outputs,
        "operators": sum(s["operators"] for s in subgraphs),
        "op_histogram": dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0]))),
        "tensors": sum(s["tensors"] for s in subgraphs),
        "weight_bytes": stats.weight_bytes(model),
        "activation_bytes": subgraphs[0]["activation_bytes"],
        "peak_activation_bytes": subgraphs[0]["peak_activation_bytes"],
        "flops": sum(s["flops"] for s in subgraphs),
        "subgraphs": subgraphs,
        "custom_ops": sorted(custom_ops),
        "control_flow": sorted({op.name for _, op in model.operators() if op.name in CONTROL_FLOW}),
        "dynamic_tensors": dynamic,
        "metadata": [name for name, _ in model.metadata],
    }


def human_count(n: int) -> str:
    """`602.4 M`-style count."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(n)


def _shape(entry: dict[str, Any]) -> str:
    dims = entry.get("shape_signature") or entry["shape"]
    return "[" + ",".join("?" if d < 0 else str(d) for d in dims) + "]"


def format_info(info: dict[str, Any], source: str) -> str:
    """The human-readable `info` report."""
    lines = [f"model: {source}"]
    if info["description"]:
        lines.append(f"description: {info['description']}")
    if info["signatures"]:
        lines.append(f"signatures: {', '.join(info['signatures'])}")
    for title in ("inputs", "outputs"):
        lines.append(f"{title}:")
        for e in info[title]:
            quant = ""
            if "quantization" in e:
                q = e["quantization"]
                quant = (
                    "  per-channel quantized"
                    if q["per_channel"]
                    else f"  scale {q['scale'][0]:.6g} zero point {q['zero_point'][0] if q['zero_point'] else 0}"
                )
            dynamic = "  (dynamic)" if e.get("dynamic") else ""
            lines.append(f"  {e['name']:<24} {e['dtype']:<8} {_shape(e)}{quant}{dynamic}")
    n_sub = len(info["subgraphs"])
    lines.append(f"operators: {info['operators']} in {n_sub} subgraph{'s' if n_sub > 1 else ''}")
    width = max((len(k) for k in info["op_histogram"]), default=0)
    for label, count in info["op_histogram"].items():
        lines.append(f"  {label:<{width}}  {count:>4}")
    lines.append(f"tensors: {info['tensors']}")
    lines.append(f"weights: {stats.human_bytes(info['weight_bytes'])}")
    lines.append(
        f"activations: {stats.human_bytes(info['activation_bytes'])} in all, "
        f"peak live {stats.human_bytes(info['peak_activation_bytes'])}"
    )
    lines.append(f"FLOPs: {human_count(info['flops'])} (2 x MACs of convolutions and matrix products)")
    if n_sub > 1:
        lines.append("subgraphs:")
        for s in info["subgraphs"]:
            lines.append(
                f"  {s['index']}: {s['name'] or '-'}  {s['operators']} ops, "
                f"peak live {stats.human_bytes(s['peak_activation_bytes'])}"
            )
    flags = []
    if info["custom_ops"]:
        flags.append(f"custom ops: {', '.join(info['custom_ops'])} (opaque to fusion)")
    if info["control_flow"]:
        flags.append(f"control flow: {', '.join(info['control_flow'])} (opaque to fusion; the subgraphs it runs are "
                     "fused on their own)")
    if info["dynamic_tensors"]:
        shown = ", ".join(info["dynamic_tensors"][:5])
        more = f" and {len(info['dynamic_tensors']) - 5} more" if len(info["dynamic_tensors"]) > 5 else ""
        flags.append(f"dynamic dimensions: {shown}{more} (kernels are compiled at the static shape, and at those "
                     "`fuse --shape` names)")
    lines.append("flags: " + ("; ".join(flags) if flags else "none"))
    return "\n".join(lines)
