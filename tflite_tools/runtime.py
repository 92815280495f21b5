"""Running models in LiteRT: the interpreter import, resolver choice and random inputs.

`ai_edge_litert` is the maintained runtime; `tflite_runtime` (2.14 and older) still works as a
fallback where LiteRT is missing, or first when `DNNFUSION_RUNTIME=tflite_runtime` asks for it.
Everything that runs a model goes through here, so tests, the CLI and benchmarks agree on how a
model is run and fed.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .interrupts import caused_by_interrupt
from .model.errors import ModelError


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
            if caused_by_interrupt(exc):
                raise  # a Ctrl-C as the runtime loaded, not a missing runtime
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


def tensor_shapes(model: bytes, subgraph: int, inputs: dict[int, tuple[int, ...]]) -> list[tuple[int, ...] | None]:
    """The shape of every tensor of subgraph `subgraph` (by index) once LiteRT has resized the inputs
    given by tensor index to the dims given, and prepared the subgraph: LiteRT's own shape rules
    (None for a tensor it left without one).
    Raises ModelError, with LiteRT's reason, where it cannot run the model at those shapes."""
    interp = Interpreter(model_content=bytes(model), experimental_op_resolver_type=RESOLVERS["builtin"])
    wrapper = interp._interpreter  # the subgraph-indexed calls the signature runner uses
    try:
        for index, dims in inputs.items():
            wrapper.ResizeInputTensor(index, np.array(dims, np.int32), False, subgraph)
        wrapper.AllocateTensors(subgraph)
    except (RuntimeError, ValueError) as exc:
        raise ModelError(f"LiteRT cannot prepare the model at these shapes: {exc}") from None
    return [_size(wrapper, k, subgraph) for k in range(wrapper.NumTensors(subgraph))]


def _size(wrapper: Any, tensor: int, subgraph: int) -> tuple[int, ...] | None:
    """A tensor's dims in a prepared subgraph; None where LiteRT gave it none (no node uses it)."""
    try:
        return tuple(int(d) for d in wrapper.TensorSize(tensor, subgraph))
    except ValueError:
        return None


# Random integer inputs (other than quantized ones) lie in [0, SMALL_INTEGERS), under any table
# they index (index_limits).
SMALL_INTEGERS = 16
# Ops reading an input as positions into another: op -> (positions input, table input).
_POSITIONS = {"GATHER": (1, 0), "GATHER_ND": (1, 0), "EMBEDDING_LOOKUP": (0, 1)}
# Ops whose first output holds the values of some of their inputs: op -> those inputs. SELECT
# passes its branches' (Keras 3's Embedding wraps negative ids: SELECT(ids < 0, ids + n, ids)).
_SAME_VALUES = {"RESHAPE": (0,), "SQUEEZE": (0,), "EXPAND_DIMS": (0,), "CAST": (0,), "SELECT": (1, 2),
                "SELECT_V2": (1, 2)}


def index_limits(interp: Any) -> dict[int, int]:
    """Per tensor the graph reads as positions into a table (directly or through a reshape, a cast
    or a select): a bound its values must stay under, the table's smallest extent (valid along any axis:
    a BERT's segment ids index a table of 2 rows)."""
    shapes = {d["index"]: d["shape"] for d in interp.get_tensor_details()}
    ops = interp._get_ops_details()
    readers: dict[int, list[dict]] = {}
    for op in ops:
        for t in op["inputs"]:
            readers.setdefault(int(t), []).append(op)
    limits: dict[int, int] = {}

    def limit(t: int, seen: frozenset[int]) -> int | None:
        found = []
        for op in readers.get(t, []):
            ins = [int(i) for i in op["inputs"]]
            if op["op_name"] in _POSITIONS:
                at, table = _POSITIONS[op["op_name"]]
                if len(ins) > max(at, table) and ins[at] == t and len(shapes[ins[table]]):
                    found.append(int(min(shapes[ins[table]])))
            elif (any(k < len(ins) and ins[k] == t for k in _SAME_VALUES.get(op["op_name"], ()))
                  and op["outputs"][0] not in seen):
                found.append(limit(int(op["outputs"][0]), seen | {t}))
        found = [f for f in found if f is not None]
        return min(found) if found else None

    for d in interp.get_input_details():
        if (bound := limit(d["index"], frozenset())) is not None:
            limits[d["index"]] = bound
    return limits


def random_inputs(interp: Any, seed: int = 0) -> list[np.ndarray]:
    """One random array per model input, in the input's dtype and shape.

    Floats are standard normal; int8/uint8, and quantized int16 (16x8 activations), span their
    whole range; other integers are small and non-negative (they are usually indices: token ids,
    gather positions), and stay under the smallest table the graph reads them as positions into
    (index_limits); bools are coin flips.
    """
    rng = np.random.default_rng(seed)
    limits = index_limits(interp)
    arrays = []
    for detail in interp.get_input_details():
        shape, dtype = tuple(detail["shape"]), np.dtype(detail["dtype"])
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype in (np.int8, np.uint8) or (dtype == np.int16 and detail["quantization"][0] != 0):
            info = np.iinfo(dtype)
            arrays.append(rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype))
        elif dtype.kind in "iu":
            top = max(1, min(SMALL_INTEGERS, limits.get(detail["index"], SMALL_INTEGERS)))
            arrays.append(rng.integers(0, top, size=shape).astype(dtype))
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


def load_inputs(paths: Sequence[str | os.PathLike], interp: Any) -> list[np.ndarray]:
    """Arrays from .npy files, one per model input, checked against the input's shape and dtype."""
    details = interp.get_input_details()
    if len(paths) != len(details):
        raise ModelError(f"the model has {len(details)} inputs, {len(paths)} .npy files given")
    arrays = []
    for path, detail in zip(paths, details):
        if not Path(path).is_file():  # a device or a pipe would be read without end
            raise ModelError(f"{path}: no such file (or not a regular file)")
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: not a readable .npy file ({exc})") from None
        if tuple(array.shape) != tuple(detail["shape"]):
            raise ModelError(f"{path}: shape {list(array.shape)}, input {detail['name']!r} takes {detail['shape'].tolist()}")
        arrays.append(array.astype(detail["dtype"], copy=False))
    return arrays


def model_inputs(interp: Any, paths: Sequence[str | os.PathLike] = (), seed: int = 0) -> list[np.ndarray]:
    """The inputs `run` and `bench` feed a model: the .npy files given, else seeded random ones."""
    return load_inputs(paths, interp) if paths else random_inputs(interp, seed)
