"""Runs inside the emulated aarch64 Python (tests/arm64_rootfs.py): one model through LiteRT with
an aarch64 dnnfusion delegate, inputs and outputs as .npy files, so the host compares them.

    python3.11 arm64_invoke.py MODEL DELEGATE REPORT IN0.npy ... -- OUT0.npy ...

Only numpy and ai_edge_litert here: the project itself is never imported on the emulated side.
"""

import sys

import numpy as np
from ai_edge_litert.interpreter import Interpreter, load_delegate


def main(argv):
    model, delegate, report = argv[:3]
    split = argv.index("--")
    inputs, outputs = argv[3:split], argv[split + 1:]
    options = {"claim": "all", "report": report, "log_level": "warning"}
    interp = Interpreter(model_path=model, experimental_delegates=[load_delegate(delegate, options=options)],
                         num_threads=1)
    interp.allocate_tensors()
    for detail, path in zip(interp.get_input_details(), inputs):
        interp.set_tensor(detail["index"], np.load(path))
    interp.invoke()
    for detail, path in zip(interp.get_output_details(), outputs):
        np.save(path, interp.get_tensor(detail["index"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
