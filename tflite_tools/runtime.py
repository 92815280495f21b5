"""Running models in LiteRT: the interpreter import, resolver choice and random inputs.

`ai_edge_litert` is the maintained runtime; `tflite_runtime` (2.14 and older) still works as a
fallback where LiteRT is missing, or first when `DNNFUSION_RUNTIME=tflite_runtime` asks for it.
Everything that runs a model goes through here, so tests, the CLI and benchmarks agree on how a
model is run and fed.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Sequence

import numpy as np


def _import_interpreter() -> tuple[str, Any]:
    """The first importable runtime, in the order DNNFUSION_RUNTIME names (default: LiteRT first)."""
    order = (os.environ.get("DNNFUSION_RUNTIME") or "ai_edge_litert,tflite_runtime").split(",")
    errors = []
    for name in (n.strip() for n in order if n.strip()):
        if name not in ("ai_edge_litert", "tflite_runtime"):
            raise ImportError(f"DNNFUSION_RUNTIME names unknown runtime {name!r}")
        try:
            return name, importlib.import_module(f"{name}.interpreter")
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("no TFLite runtime found (pip install ai-edge-litert): " + "; ".join(errors))


RUNTIME, _interpreter = _import_interpreter()

Interpreter = _interpreter.Interpreter
OpResolverType = _interpreter.OpResolverType
load_delegate = _interpreter.load_delegate

# The resolvers the project runs models with, by the name used in options and reports.
RESOLVERS = {
    # TFLite's optimized kernels with XNNPACK applied to what it supports (the default).
    "xnnpack": OpResolverType.AUTO,
    # TFLite's optimized builtin kernels, no default delegate.
    "builtin": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    # TFLite's reference kernels: the ground truth every lowering is tested against.
    "reference": OpResolverType.BUILTIN_REF,
}


def make_interpreter(
    model: bytes | str | os.PathLike,
    resolver: str = "xnnpack",
    num_threads: int = 1,
    delegates: Sequence[Any] | None = None,
    preserve_all_tensors: bool = False,
) -> Any:
    """An allocated LiteRT interpreter for a model given as bytes or a path.

    `preserve_all_tensors` keeps intermediate tensors readable after `invoke` (for comparing
    blocks of a model one by one).
    """
    kwargs: dict[str, Any] = dict(
        experimental_op_resolver_type=RESOLVERS[resolver],
        num_threads=num_threads,
        experimental_delegates=list(delegates or []),
    )
    if preserve_all_tensors:
        kwargs["experimental_preserve_all_tensors"] = True
    if isinstance(model, (bytes, bytearray)):
        interp = Interpreter(model_content=bytes(model), **kwargs)
    else:
        interp = Interpreter(model_path=os.fspath(model), **kwargs)
    interp.allocate_tensors()
    return interp


def random_inputs(interp: Any, seed: int = 0) -> list[np.ndarray]:
    """One random array per model input, in the input's dtype and shape.

    Floats are standard normal; int8/uint8, and quantized int16 (16x8 activations), span their
    whole range; other integers are small and non-negative (they are usually indices: token ids,
    gather positions), bools are coin flips.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for detail in interp.get_input_details():
        shape, dtype = tuple(detail["shape"]), np.dtype(detail["dtype"])
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype in (np.int8, np.uint8) or (dtype == np.int16 and detail["quantization"][0] != 0):
            info = np.iinfo(dtype)
            arrays.append(rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype))
        elif dtype.kind in "iu":
            arrays.append(rng.integers(0, 16, size=shape).astype(dtype))
        elif dtype == np.bool_:
            arrays.append(rng.integers(0, 2, size=shape).astype(np.bool_))
        else:
            raise ValueError(f"cannot make random input of dtype {dtype}")
    return arrays


def run(interp: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Invokes with `inputs` (in input order) and returns copies of all outputs."""
    for detail, value in zip(interp.get_input_details(), inputs):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return [_output(interp, d) for d in interp.get_output_details()]


def _output(interp: Any, detail: dict) -> np.ndarray:
    """A copy of an output. LiteRT refuses to read one of no elements (a RANGE to 0: "Invalid tensor
    size"), so that is made here, of its current shape."""
    if 0 in detail["shape"]:
        return np.zeros(detail["shape"], detail["dtype"])
    return interp.get_tensor(detail["index"]).copy()
