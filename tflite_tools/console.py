"""The `tflite_tools` console script and `python -m tflite_tools`: Ctrl-C while the commands'
modules load (Halide and LiteRT take about a second) ends the command as it does later, with exit
code 130 and one line, not a traceback."""

from __future__ import annotations

import sys


def main() -> int:
    """Loads the commands and runs the one the arguments name; returns the exit code."""
    try:
        from .cli import main as run_command
    except KeyboardInterrupt:
        print("tflite_tools: interrupted", file=sys.stderr)
        return 130
    return run_command()
