"""tflite_tools: read, write, build and inspect TensorFlow Lite models.

The file-format stage of dnnfusion: it knows the `.tflite` flatbuffer and nothing about fusion.

    model = tflite_tools.load("model.tflite")   # graph IR (tflite_tools.model.ir)
    tflite_tools.save(model, "copy.tflite")      # atomic write

The names below load on first use (PEP 562): the console script imports this package first, and
Ctrl-C while numpy loads would otherwise end it with a traceback (tflite_tools.console).
"""

from __future__ import annotations

import importlib
from typing import Any

_API = {
    "ModelBuilder": "builder", "ModelError": "errors", "Model": "ir", "OpCode": "ir", "Operator": "ir",
    "Quantization": "ir", "Signature": "ir", "Subgraph": "ir", "Tensor": "ir", "load": "reader", "parse": "reader",
    "save": "writer", "serialize": "writer",
}

__all__ = sorted(_API) + ["__version__"]


def _version() -> str:
    """The installed dnnfusion package's version (pyproject.toml), or 0+unknown from a bare tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dnnfusion")
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'tflite_tools' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".model.{_API[name]}", __name__), name)
    globals()[name] = value
    return value
