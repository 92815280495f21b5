"""Fusion counts per model: ours (rewrite + plan) next to TVM relax FuseOps, as a Markdown table.

    python bench/fusion_table.py [--tvm-python /path/to/tvm/venv/bin/python] [--fast-math] [MODEL ...]

Default models: the reference models (bench/zoo.py). With `--tvm-python`, each model is also run through
bench/tvm_fusion.py in that interpreter (TVM lives in its own venv: see that script's docstring).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import tflite_tools  # noqa: E402
from fusion.pipeline import plan_model  # noqa: E402
from tflite_tools.model.stats import human_bytes  # noqa: E402


def ours(path: Path, fast_math: bool) -> dict:
    """Our plan's figures for one model."""
    return plan_model(tflite_tools.load(path), fast_math=fast_math).to_json()


def tvm(path: Path, python: str) -> dict | None:
    """TVM's counts for one model, or None when TVM cannot import it."""
    proc = subprocess.run([python, str(REPO / "bench" / "tvm_fusion.py"), str(path)], capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else None


def main(argv: list[str] | None = None) -> int:
    """Prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--tvm-python", help="python of a venv with apache-tvm and tflite")
    parser.add_argument("--fast-math", action="store_true")
    args = parser.parse_args(argv)
    from zoo import reference_models

    paths = args.models or reference_models()
    header = ("| model | ops | after rewrite | blocks (fused) | fusion rate | intermediates before -> after "
              "| peak live before -> after |")
    rule = "|---|---|---|---|---|---|---|"
    if args.tvm_python:
        header += " TVM relax ops | TVM kernels | TVM rate |"
        rule += "---|---|---|"
    print(header)
    print(rule)
    for path in paths:
        d = ours(path, args.fast_math)
        fused = sum(1 for b in d["blocks"] if len(b["ops"]) > 1)
        row = (
            f"| {path.stem} | {d['ops']} | {d['ops_after_rewrite']} | {len(d['blocks'])} ({fused}) | "
            f"{d['fusion_rate']:.2f} | {human_bytes(d['intermediate_bytes_before'])} -> "
            f"{human_bytes(d['intermediate_bytes_after'])} | {human_bytes(d['peak_bytes_before'])} -> "
            f"{human_bytes(d['peak_bytes_after'])} |"
        )
        if args.tvm_python:
            t = tvm(path, args.tvm_python)
            row += (" import failed | - | - |" if t is None else
                    f" {t['relax_ops']} | {t['fused_functions']} | {d['ops'] / t['fused_functions']:.2f} |")
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
