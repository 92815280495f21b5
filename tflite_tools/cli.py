"""The `tflite_tools` command line.

Every command turns a bad input into one line on stderr and exit code 2 (the code argparse uses
for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from .atomic import write_bytes_atomic
from .errors import ModelError
from .info import format_info, model_info
from .reader import load


def cmd_info(args: argparse.Namespace) -> int:
    """Prints inputs, outputs, op histogram, sizes, memory and FLOPs of a model."""
    info = model_info(load(args.model))
    if args.json:
        print(json.dumps({"model": args.model, **info}, indent=2))
    else:
        print(format_info(info, args.model))
    return 0


def cmd_fuse(args: argparse.Namespace) -> int:
    """Rewrites and plans a model (`--plan-only`): blocks, fusion rate, memory before and after."""
    # The CLI is the outermost layer: it may call every stage; tflite_tools itself never does.
    from fusion.pipeline import plan_model
    from fusion.report import format_summary, to_dot

    if not args.plan_only:
        raise ModelError("fuse: only --plan-only is available so far (code generation is not built yet)")
    trace = (lambda line: print(f"[rewrite] {line}", file=sys.stderr)) if args.verbose else None
    cost = None
    if args.cost == "profile":
        from halide_gen.profile import HostProfiler

        cost = HostProfiler()
    summary = plan_model(load(args.model), fast_math=args.fast_math, cost=cost, trace=trace)
    if args.dot:
        write_dot(to_dot(summary), args.dot)
    if args.json:
        print(json.dumps({"model": args.model, **summary.to_json()}, indent=2))
    else:
        print(format_summary(summary, args.model, explain=args.explain))
    return 0


def write_dot(text: str, path: str) -> None:
    """Writes Graphviz text, or renders it when `path` ends in .svg / .png / .pdf."""
    target = Path(path)
    fmt = target.suffix.lstrip(".").lower()
    if fmt not in ("svg", "png", "pdf"):
        write_bytes_atomic(target, text.encode())
        return
    dot = shutil.which("dot")
    if dot is None:
        raise ModelError(f"{path}: rendering .{fmt} needs Graphviz `dot` (apt-get install graphviz); use a .dot name")
    rendered = subprocess.run([dot, f"-T{fmt}"], input=text.encode(), capture_output=True, check=False)
    if rendered.returncode != 0:
        raise ModelError(f"{path}: dot failed: {rendered.stderr.decode(errors='replace').strip()}")
    write_bytes_atomic(target, rendered.stdout)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tflite_tools",
        description="Inspect TensorFlow Lite models and fuse them into Halide kernels (dnnfusion).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="summarise a model: I/O, ops, memory, FLOPs")
    info.add_argument("model", metavar="MODEL", help="path to a .tflite file")
    info.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    info.set_defaults(run=cmd_info)

    fuse = sub.add_parser("fuse", help="rewrite the graph and plan fused blocks (DNNFusion)")
    fuse.add_argument("model", metavar="MODEL", help="path to a .tflite file")
    fuse.add_argument("--plan-only", action="store_true", help="stop after planning: print the blocks")
    fuse.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    fuse.add_argument("--dot", metavar="FILE", help="draw the graph coloured by block (.dot, or .svg/.png with Graphviz)")
    fuse.add_argument("--fast-math", action="store_true", help="also apply rewrites that change float rounding")
    fuse.add_argument("--explain", action="store_true", help="report how often each rewrite rule fired")
    fuse.add_argument("--verbose", action="store_true", help="trace each rewrite and the graph after each pass")
    fuse.add_argument("--cost", choices=["roofline", "profile"], default="roofline",
                      help="what answers yellow Table 3 cells: the static roofline, or Halide kernels timed here")
    fuse.set_defaults(run=cmd_fuse)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tflite_tools` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except ModelError as exc:
        print(f"tflite_tools: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tflite_tools: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
