"""The `tflite_tools` console script and `python -m tflite_tools`: Ctrl-C while the commands'
modules load (Halide and LiteRT take about a second) ends the command as it does later, with exit
code 130 and one line, not a traceback."""

from __future__ import annotations

import signal
import sys

from .interrupts import caused_by_interrupt, forget_handled_interrupts


def main() -> int:
    """Loads the commands and runs the one the arguments name; returns the exit code."""
    try:
        from .cli import main as run_command

        return run_command()
    except (KeyboardInterrupt, ImportError) as exc:
        if not caused_by_interrupt(exc):  # a native module interrupted as it initialised is one too
            raise
        print("tflite_tools: interrupted", file=sys.stderr)
        return 130
    finally:
        # The command is over (argparse's --help and errors exit from inside it) and its status
        # decided. Python gives SIGINT back its default action as the interpreter tears down, so a
        # Ctrl-C then would end a finished command by the signal, or raise in an exit handler.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        forget_handled_interrupts()
