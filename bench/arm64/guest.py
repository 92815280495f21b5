"""Runs inside the emulated aarch64 Python (bench/arm_count.py starts it under qemu-aarch64 with the
counting plugin, bench/arm64/counter.c): for each case of a job file, loads the model in LiteRT (with
an external delegate where the case names one), warms it up, and marks the counters before and after
K invokes. Needs only numpy and LiteRT.

    python guest.py JOB.json
    JOB.json: {"warmup": 2, "invokes": 5, "threads": 1,
               "cases": [{"model": "m.tflite", "delegate": "lib.so" | null, "options": {...},
                          "xnnpack_flags": null | int, "signature": null | "decode",
                          "inputs": "inputs.npz"}, ...]}

A case with XNNPACK flags runs through LiteRT's CompiledModel (its CPU options carry them), the
others through the Interpreter.

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


def interpreter_invoke(case: dict, threads: int):
    """The case's model in the Interpreter (with its delegate), inputs set: its invoke (of the
    case's signature where it names one: its inputs by name, set once, its outputs not copied out)."""
    delegates = [load_delegate(case["delegate"], case.get("options", {}))] if case.get("delegate") else []
    interpreter = Interpreter(case["model"], experimental_delegates=delegates, num_threads=threads)
    if case.get("signature"):
        runner = interpreter.get_signature_runner(case["signature"])
        with np.load(case["inputs"]) as arrays:
            runner(**{name: arrays[name] for name in arrays.files})
        return lambda: interpreter._interpreter.Invoke(runner._subgraph_index)
    interpreter.allocate_tensors()
    fill_inputs(interpreter, case["inputs"])
    return interpreter.invoke


def compiled_model_invoke(case: dict, threads: int):
    """The case's model in LiteRT's CompiledModel on the CPU with XNNPACK's flags, its signature's
    (or its first signature's, matched to the input order by tensor name) inputs set: its run."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import CpuOptions, Options

    options = Options(hardware_accelerators=HardwareAccelerator.CPU,
                      cpu_options=CpuOptions(num_threads=threads, xnnpack_flags=case["xnnpack_flags"]))
    model = CompiledModel.from_file(case["model"], options=options)
    signatures = model.get_signature_list()
    signature = case.get("signature") or next(iter(signatures))
    details = model.get_input_tensor_details(signature)
    with np.load(case["inputs"]) as arrays:
        if case.get("signature"):  # saved by the signature's input names
            by_key = {key: arrays[key] for key in arrays.files}
        else:  # saved in the model's input order
            order = [d["name"] for d in Interpreter(case["model"]).get_input_details()]
            by_tensor = {name: arrays[key] for name, key in zip(order, arrays.files)}
            by_key = {key: by_tensor[detail["name"]] for key, detail in details.items()}
    inputs = {}
    for key in details:
        inputs[key] = model.create_input_buffer_by_name(signature, key)
        inputs[key].write(by_key[key])
    outputs = {key: model.create_output_buffer_by_name(signature, key) for key in signatures[signature]["outputs"]}
    return lambda: model.run_by_name(signature, inputs, outputs)


def main() -> None:
    """Runs every case of the job, bracketing its invokes with marks."""
    with open(sys.argv[1]) as f:
        job = json.load(f)
    for i, case in enumerate(job["cases"]):
        make = interpreter_invoke if case.get("xnnpack_flags") is None else compiled_model_invoke
        invoke = make(case, job["threads"])
        for _ in range(job["warmup"]):
            invoke()
        mark(2 * i)
        for _ in range(job["invokes"]):
            invoke()
        mark(2 * i + 1)
        del invoke


if __name__ == "__main__":
    main()
