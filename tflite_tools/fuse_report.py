"""report.md: what `fuse` did, for people (plan.json holds the same for tools)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fusion.report import format_summary

from .measure import MEASURED_THREADS
from .windows import DIRECTIONS

if TYPE_CHECKING:  # pragma: no cover
    from .fuse import FuseResult


def _medians(medians: dict[str, float]) -> str:
    """'all 1.234, profitable 1.300, none 1.250' for the report."""
    return ", ".join(f"{k} {v:.3f}" for k, v in medians.items())


def _size_line(sizes: dict[str, int | None]) -> str:
    def mib(n: int) -> str:
        return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
    text = f"fused model {mib(sizes['fused_model'])} (original {mib(sizes['original_model'])})"
    return text + (f"; delegate library {mib(sizes['library'])}" if sizes.get("library") is not None else "")


def _windows_line(with_kernel) -> str:
    """How many blocks keep their kernels when the model is resized along each direction."""
    counts = [f"along the {d}, {sum(d in k.windows for k in with_kernel)} of {len(with_kernel)}"
              for d in DIRECTIONS if any(d in k.windows for k in with_kernel)]
    return ("- Blocks that run on windows of their compiled steps where the model is resized (the rest run at "
            "compiled shapes only; plan.json `windows`): " + "; ".join(counts))


def format_report(result: FuseResult, summary, source: str, target: str) -> str:
    """report.md: the plan, then what became of each block."""
    with_kernel = [k for k in result.kernels if k.kernel]
    lines = [
        f"# dnnfusion report: {Path(source).name} ({target})",
        "",
        f"- Blocks: {len(result.kernels)}; with a Halide kernel: {len(with_kernel)} "
        f"({result.claimable_nodes} of "
        f"{sum(len(s.subgraph.operators) for s in (summary, *(s.summary for s in result.subgraphs)))} operators); "
        f"profitable: {sum(k.profitable for k in result.kernels)}",
        *(["- Other subgraphs, planned and compiled too (their blocks are named `<subgraph>.block_NNN`): "
           + ", ".join(f"{s.index} `{s.name}`" for s in result.subgraphs)] if result.subgraphs else []),
        *(["- Compiled at other input shapes too (`--shape`; the delegate runs these kernels when the model is "
           "resized to them): " + ", ".join(f"`{v.name}` (blocks `{v.prefix}block_NNN`)" for v in result.variants)]
          if result.variants else []),
        *([_windows_line(with_kernel)] if any(k.windows for k in with_kernel) else []),
        f"- Delegate: `{result.library.name if result.library else 'android/arm64-v8a (build it with the NDK)'}`; "
        f"fused model: `model.fused.tflite`",
        f"- Size: {_size_line(result.sizes)}",
        f"- Compile: {result.seconds:.1f} s ({sum(k.cached for k in with_kernel)} of {len(with_kernel)} kernels "
        "from the cache)",
        f"- Default claim policy: `{result.default_claim}` at one thread, `{result.default_claim_threaded}` at more"
        + (" (whole model, median ms: one thread " + _medians(result.whole_model_ms) + f"; {MEASURED_THREADS} threads "
           + _medians(result.whole_model_ms_threaded) + "; `none` = XNNPACK alone)"
           if result.whole_model_ms else " (not measured: `fuse --measure` times it)"),
        "",
        "## Plan",
        "",
        "```",
        format_summary(summary, source),
        "```",
        "",
        *[line for s in result.subgraphs
          for line in (f"### Subgraph {s.index}: {s.name}", "", "```", format_summary(s.summary, source), "```", "")],
        "## Blocks",
        "",
        "| block | ops | kernel | schedule | halide / xnnpack | claimed by default | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in result.kernels:
        ratio = f"{k.ratio:.2f}" if k.ratio is not None else "not measured"
        lines.append(f"| {k.block} | {' '.join(k.ops)} | {'`' + k.kernel + '`' if k.kernel else '-'} | "
                     f"{k.schedule if k.kernel else '-'} | {ratio if k.kernel else '-'} | "
                     f"{'yes' if k.profitable else 'no'} | {k.skipped or ''} |")
    return "\n".join(lines) + "\n"
