"""The `tflite_tools` command line.

Every command turns a bad input into one line on stderr and exit code 2 (the code argparse uses
for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

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
