"""Lowerings from TFLite builtins to Halide definitions (one registry, see registry.py)."""

# Importing registers the lowerings.
from . import elementwise, hybrid, mediapipe, movement, nn, quantized, quantized16, reduce, tables  # noqa: F401
from .registry import (LOWERINGS, AccumulatorKind, LoweringError, OpContext, ReductionDomain, RowReduction,
                       RowStatistics, lower)

__all__ = ["LOWERINGS", "AccumulatorKind", "LoweringError", "OpContext", "ReductionDomain", "RowReduction",
           "RowStatistics", "lower"]
