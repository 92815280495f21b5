"""Runs inside the emulated aarch64 Python (bench/arm_count.py starts it under qemu-aarch64 with the
counting plugin, bench/arm64/counter.c): for each case of a job file, loads the model in LiteRT (with
an external delegate where the case names one), warms it up, and marks the counters before and after
K invokes. Needs only numpy and LiteRT.

    python guest.py JOB.json
    JOB.json: {"warmup": 2, "invokes": 5, "threads": 1,
               "cases": [{"model": "m.tflite", "delegate": "lib.so" | null, "options": {...},
                          "inputs": "inputs.npz"}, ...]}

Case i is bracketed by marks 2i and 2i + 1.
"""

import json
import os
import sys

import numpy as np

try:
    from ai_edge_litert.interpreter import Interpreter, load_delegate
except ImportError:  # the older package name
    from tflite_runtime.interpreter import Interpreter, load_delegate

MARK_MAGIC = 0x6466  # counter.c's kMarkMagic


def mark(tag: int) -> None:
    """Has the plugin record the running counts: getpriority with an invalid `which`, which the
    kernel refuses (EINVAL) and the plugin sees."""
    try:
        os.getpriority(MARK_MAGIC, tag)
    except OSError:
        pass


def fill_inputs(interpreter, path: str) -> None:
    """The case's inputs, as the host made them (bench/arm_count.write_inputs), in input order."""
    with np.load(path) as arrays:
        for d, name in zip(interpreter.get_input_details(), arrays.files):
            interpreter.set_tensor(d["index"], arrays[name])


def main() -> None:
    """Runs every case of the job, bracketing its invokes with marks."""
    with open(sys.argv[1]) as f:
        job = json.load(f)
    for i, case in enumerate(job["cases"]):
        delegates = [load_delegate(case["delegate"], case.get("options", {}))] if case.get("delegate") else []
        interpreter = Interpreter(case["model"], experimental_delegates=delegates, num_threads=job["threads"])
        interpreter.allocate_tensors()
        fill_inputs(interpreter, case["inputs"])
        for _ in range(job["warmup"]):
            interpreter.invoke()
        mark(2 * i)
        for _ in range(job["invokes"]):
            interpreter.invoke()
        mark(2 * i + 1)
        del interpreter, delegates


if __name__ == "__main__":
    main()
