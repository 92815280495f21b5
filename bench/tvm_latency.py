"""Latency of Apache TVM (relax, untuned) on a TFLite model: the peer benchmark for bench/run.py.

Runs in TVM's own environment (see bench/tvm_fusion.py for setting it up), one model per call:

    TVM_NUM_THREADS=1 /work/tvmvenv/bin/python bench/tvm_latency.py MODEL.tflite IN0.npy [IN1.npy ...]

Imports the model with the relax TFLite frontend, compiles it with relax's default CPU pipeline
(legalize, fuse, schedule rules; no tuning) for this machine's CPU (`llvm`, `mcpu` from LLVM's host
detection, one core), and times `main` with TVM's time_evaluator (10 runs x 5 repeats). Prints one
JSON line: {"model", "compile_s", "median_ms", "min_ms", "max_ms", "tvm_version"} or, when the
frontend or the build fails, {"model", "error"} (exit 0 either way: a failure is a result).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> int:
    """Compiles, times and prints the JSON line."""
    import numpy as np
    import tvm
    from tvm import relax

    from tvm_fusion import FrontendError, import_relax

    path, inputs = argv[0], argv[1:]
    result: dict = {"model": path, "tvm_version": tvm.__version__}
    try:
        mod = import_relax(path)
        cpu = tvm.target.codegen.llvm_get_system_cpu()
        target = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": 1})
        start = time.perf_counter()
        executable = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
        result["compile_s"] = time.perf_counter() - start
        device = tvm.cpu()
        vm = relax.VirtualMachine(executable, device)
        args = [tvm.runtime.tensor(np.load(p), device) for p in inputs]
        vm["main"](*args)
        timing = vm.time_evaluator("main", device, number=10, repeat=5)(*args)
        result.update(median_ms=timing.median * 1e3, min_ms=timing.min * 1e3, max_ms=timing.max * 1e3)
    except FrontendError as exc:
        result["error"] = f"frontend: {exc}"
    except Exception as exc:  # noqa: BLE001 - any build or run failure is reported as the result
        lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith(("#", " "))]
        result["error"] = f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
