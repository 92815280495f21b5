"""tflite_tools: read, write, build and inspect TensorFlow Lite models.

The file-format stage of dnnfusion: it knows the `.tflite` flatbuffer and nothing about fusion.

    model = tflite_tools.load("model.tflite")   # graph IR (tflite_tools.model.ir)
    tflite_tools.save(model, "copy.tflite")      # atomic write
"""

from .model.builder import ModelBuilder
from .model.errors import ModelError
from .model.ir import Model, OpCode, Operator, Quantization, Signature, Subgraph, Tensor
from .model.reader import load, parse
from .model.writer import save, serialize

__all__ = [
    "Model", "ModelBuilder", "ModelError", "OpCode", "Operator", "Quantization", "Signature",
    "Subgraph", "Tensor", "load", "parse", "save", "serialize",
]
