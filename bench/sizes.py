"""What shipping a fused model costs an app in bytes: the original model, the fused one, and the
delegate library per target.

    python bench/sizes.py [MODEL ...] [--targets host arm64-linux] [--out bench/out/sizes] [--json]

Fuses each model (default: the reference set, bench/zoo.py, and the project's fp16 test models) for
each target into OUT/<model>/<target>/ and prints a markdown table of the sizes `fuse` records in
plan.json. The arm64-linux library holds the same kernels and Halide runtime (arm-64) an Android
build links, less the JNI shim and liblog. Sizes do not depend on the host.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def measure(model: Path, targets: list[str], out: Path) -> dict:
    """One row: the model's sizes, fused once per target (the fused model is the same for all)."""
    from tflite_tools.fuse import fuse

    row: dict = {"model": model.stem}
    for target in targets:
        result = fuse(model, out / model.stem / target, target=target)
        row.update(original_model=result.sizes["original_model"], fused_model=result.sizes["fused_model"],
                   decoders=result.decoders)
        row[f"library_{target}"] = result.sizes["library"]
    return row


def table(rows: list[dict], targets: list[str]) -> str:
    """The rows as markdown, sizes in KiB, the fused model also as a ratio to the original."""
    head = "| model | original | fused model | fused / original | decoders kept | " + \
        " | ".join(f"library ({t})" for t in targets) + " |"
    lines = [head, "|---" * (5 + len(targets)) + "|"]
    for r in rows:
        libraries = " | ".join(f"{r[f'library_{t}'] / 1024:,.0f} KiB" for t in targets)
        lines.append(f"| {r['model']} | {r['original_model'] / 1024:,.0f} KiB | {r['fused_model'] / 1024:,.0f} KiB | "
                     f"{r['fused_model'] / r['original_model']:.4f} | {r['decoders']} | {libraries} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: fuse, then print the table (or JSON)."""
    from zoo import FP16_TEST_MODELS, models_from_tests, reference_models

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", type=Path, help="default: the reference set and the fp16 test models")
    parser.add_argument("--targets", nargs="+", default=["host", "arm64-linux"])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "sizes")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    models = args.models or [*reference_models(REPO / "bench" / "out" / "zoo"), *models_from_tests(FP16_TEST_MODELS)]
    rows = []
    for model in models:
        rows.append(measure(model, args.targets, args.out))
        print(f"{model.stem}: done", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1) if args.json else table(rows, args.targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
