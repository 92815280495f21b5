"""Runs one model through a TFLite runtime with a dnnfusion delegate, in another Python: the
emulated aarch64 one (bench/arm64_rootfs.py) or a tflite-runtime 2.14 venv. Inputs and outputs are
.npy files, so the host compares them with its own LiteRT reference.

    python invoke_with_delegate.py MODEL DELEGATE REPORT IN0.npy ... -- OUT0.npy ...

Only numpy and the runtime are imported (ai_edge_litert, else tflite_runtime): never the project.
"""

import sys

import numpy as np

try:
    from ai_edge_litert.interpreter import Interpreter, load_delegate
except ImportError:
    from tflite_runtime.interpreter import Interpreter, load_delegate


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
