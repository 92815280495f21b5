"""A kernel's lowered Halide statements, with names that are the same in any test process.

Halide makes a Func's name unique within the process by suffixing `$n` when one of the same name
was made before, so the name a test sees depends on which tests ran before it. Every statement
a test reads goes through `stable`, and so does every name it looks for in one.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

_UNIQUE_SUFFIX = re.compile(r"\$\d+")


def stable(text: str) -> str:
    """`text` (a statement, a listing or a name) without Halide's per-process `$n` name suffixes."""
    return _UNIQUE_SUFFIX.sub("", text)


def stable_name(func) -> str:
    """A Halide Func's (or parameter's) name as `stable` text spells it."""
    return stable(func.name())


def lowered_stmt(kernel) -> str:
    """The scheduled kernel's lowered Halide statement, names stable."""
    import halide as hl

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.stmt"
        kernel.pipeline().compile_to_lowered_stmt(str(path), [a.param for a in kernel.arguments],
                                                  hl.StmtOutputFormat.Text)
        return stable(path.read_text())


def compiled_stmts(art) -> list[str]:
    """The lowered statements an AOT-compiled artifact wrote beside it, one per sub-target, names stable.
    (Assembly listings are read as they are: `$` starts an x86 immediate there.)"""
    return [stable(p.read_text()) for p in sorted(p for p in art.extra if p.suffix == ".stmt")]


def scheduled_stmt(model, params=None, options=None) -> str:
    """The lowered statement of `model`'s ops as one block (its last op's output), under the CPU
    templates with `params` (default: x86's) and the lowering's `options` (default: its defaults)."""
    from halide_gen.block import build_block
    from halide_gen.schedule import schedule_cpu

    ops = model.main.operators
    kernel = build_block("blk", ops, [ops[-1].outputs[0]], *([options] if options is not None else []))
    schedule_cpu(kernel, *([params] if params is not None else []))
    return lowered_stmt(kernel)
