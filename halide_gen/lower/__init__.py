"""Lowerings from TFLite builtins to Halide definitions (one registry, see registry.py)."""

from . import elementwise, mediapipe, movement, nn, quantized, quantized16, reduce  # noqa: F401 - importing registers the lowerings
from .registry import LOWERINGS, AccumulatorKind, LoweringError, OpContext, RowReduction, lower

__all__ = ["LOWERINGS", "AccumulatorKind", "LoweringError", "OpContext", "RowReduction", "lower"]
