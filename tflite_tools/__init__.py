"""tflite_tools: read, write, build and inspect TensorFlow Lite models.

The file-format stage of dnnfusion: it knows the `.tflite` flatbuffer and nothing about fusion.

    model = tflite_tools.load("model.tflite")   # graph IR (tflite_tools.ir)
    tflite_tools.save(model, "copy.tflite")      # atomic write
"""

from .builder import ModelBuilder
from .errors import ModelError
from .ir import Model, OpCode, Operator, Quantization, Signature, Subgraph, Tensor
from .reader import load, parse
from .writer import save, serialize

__all__ = [
    "Model", "ModelBuilder", "ModelError", "OpCode", "Operator", "Quantization", "Signature",
    "Subgraph", "Tensor", "load", "parse", "save", "serialize",
]
