"""Count the kernels Apache TVM's relax fusion makes from TFLite models.

This is a comparison baseline for the project's own fusion plan. It needs a
Python environment with ``apache-tvm`` (relax, 0.27 or later) and the ``tflite``
flatbuffer bindings, kept apart from the project's own environment::

    python3 -m venv /work/tvmvenv
    /work/tvmvenv/bin/pip install apache-tvm tflite
    /work/tvmvenv/bin/python bench/tvm_fusion.py MODEL.tflite [MODEL.tflite ...]

For each model it prints one JSON object per line::

    {"model": "...", "relax_ops": N, "fused_functions": M, "tvm_version": "..."}

What is counted
---------------
``relax_ops``
    Call nodes whose callee is a relax operator (``tvm.ir.Op``) in the graph-level
    relax functions of the module the relax TFLite frontend (``from_tflite``)
    imports, before any pass: ``main``, plus the private functions it makes for
    control flow (WHILE/IF subgraphs); the reference models have only ``main``.
    One TFLite op may become several relax ops (e.g. CONV_2D
    with bias and RELU6 is ``conv2d`` + ``add`` + ``clip``).

``fused_functions``
    Kernel call sites in those graph-level functions (``main`` and any
    control-flow functions; static call sites, not loop iterations) after TVM's CPU lowering-and-fusion passes
    (``relax.backend.cpu_generic.legalize_passes``, the same list as the
    ``zero`` pipeline without tuning): ``LegalizeOps``, ``AnnotateTIROpPattern``,
    ``FoldConstant``, ``FuseOps``, ``FuseTIR``, run under an ``llvm`` target.
    A kernel call is a ``call_tir`` / ``call_tir_inplace`` /
    ``call_tir_with_grad`` / ``call_dps_packed`` call, or a direct call of a
    ``PrimFunc``, counted once per call site (a PrimFunc reused by two call
    sites counts twice). That covers both the ``fused_*`` functions FuseTIR
    made from several ops and the single-op TIR functions left unfused.
    A compute op that ``LegalizeOps`` could not lower stays a plain relax op
    call (TVM 0.27 cannot legalize NHWC ``conv2d_transpose``, so
    ``relax.build`` would reject such a model); each one is also counted as a
    kernel call, since it cannot be fused and would need a kernel of its own.
    ``--verbose`` lists them under ``unlegalized_ops``.
    Work folded away by ``FoldConstant`` (e.g. weight transposes) is not
    counted. Reshape-only kernels are still counted here even though TVM's
    later ``RewriteDataflowReshape`` turns them into free views; ``--verbose``
    reports that number too.

Note: in TVM 0.27, ``relax.build(..., target="llvm")`` with its ``"default"``
pipeline legalizes but does not fuse on CPU; fusion is what the ``zero``
pipeline and ``relax.get_default_pipeline(target)`` apply, so that is what this
script measures.

Exit status: 0 when every model was imported and fused; 2 when any model could
not be read or imported by the frontend (one line on stderr per such model);
3 when a model imported but the fusion passes failed. Models after a failing
one are still processed.

Only the standard library, ``tvm`` and its dependencies (``tflite``, ``numpy``)
are imported; nothing from this project.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

# Ops that run a kernel (a TIR PrimFunc or an external packed function).
KERNEL_CALL_OPS = frozenset(
    {"relax.call_tir", "relax.call_tir_inplace", "relax.call_tir_with_grad", "relax.call_dps_packed"}
)

# Relax ops that do no tensor computation: not counted as kernels when left in main.
NON_KERNEL_OPS = frozenset(
    {
        "relax.shape_of",
        "relax.null_value",
        "relax.print",
        "relax.assert_op",
        "relax.tensor_to_shape",
        "relax.shape_to_tensor",
    }
)
NON_KERNEL_PREFIXES = ("relax.builtin.", "relax.memory.", "relax.vm.", "relax.hint.")


class FrontendError(Exception):
    """The model could not be read or imported by TVM's TFLite frontend."""


def load_tflite(path: str):
    """Read ``path`` and return the ``tflite`` flatbuffer ``Model`` object.

    Raises FrontendError if the file cannot be read or parsed.
    """
    import tflite  # the flatbuffer bindings TVM's frontend expects

    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as err:
        raise FrontendError(f"cannot read: {err}") from err
    try:
        try:
            return tflite.Model.GetRootAsModel(buf, 0)
        except AttributeError:  # tflite < 2.1 layout
            return tflite.Model.Model.GetRootAsModel(buf, 0)
    except Exception as err:  # noqa: BLE001 - any parse failure is reported
        raise FrontendError(f"not a TFLite flatbuffer: {type(err).__name__}: {err}") from err


def import_relax(path: str):
    """Import the TFLite model at ``path`` into a relax ``IRModule``.

    Raises FrontendError (with a one-line reason) if the frontend fails.
    """
    from tvm.relax.frontend.tflite import from_tflite

    model = load_tflite(path)
    try:
        return from_tflite(model)
    except Exception as err:  # noqa: BLE001 - frontend raises many types
        raise FrontendError(_one_line(err)) from err


def fuse(mod):
    """Run TVM's CPU legalize-and-fuse passes on ``mod`` and return the result."""
    import tvm
    from tvm import relax

    target = tvm.target.Target("llvm")
    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(passes)(mod)


def graph_functions(mod) -> list:
    """Return ``mod``'s graph-level relax functions: ``main`` and control-flow bodies.

    Functions marked ``Primitive`` (FuseOps' groups, before FuseTIR) are left out.
    """
    from tvm import relax

    funcs = []
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function):
            attrs = func.attrs
            if attrs is not None and "Primitive" in attrs and int(attrs["Primitive"]):
                continue
            funcs.append(func)
    return funcs


def count_op_calls(mod) -> collections.Counter:
    """Return a Counter of relax operator names called in ``mod``'s graph-level functions."""
    import tvm
    from tvm import relax

    counts: collections.Counter = collections.Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            counts[expr.op.name] += 1

    for func in graph_functions(mod):
        relax.analysis.post_order_visit(func.body, visit)
    return counts


def count_kernel_calls(mod) -> tuple[int, int, collections.Counter]:
    """Count kernel call sites in ``mod``'s graph-level functions (see module docstring).

    Returns ``(kernels, reshape_kernels, unlegalized)``: the kernel call count
    (including unlegalized compute ops), how many of those call a PrimFunc that
    is a pure reshape (which TVM's ``RewriteDataflowReshape`` later turns into
    a free view), and a Counter of the compute ops ``LegalizeOps`` left as
    relax op calls.
    """
    import tvm
    from tvm import relax

    prim_func = _prim_func_type()
    kernels = 0
    reshape_kernels = 0
    unlegalized: collections.Counter = collections.Counter()

    def is_reshape(gvar) -> bool:
        try:
            return bool(relax.analysis.has_reshape_pattern(mod[gvar]))
        except Exception:  # noqa: BLE001 - not a PrimFunc or unanalysable
            return False

    def visit(expr):
        nonlocal kernels, reshape_kernels
        if not isinstance(expr, relax.Call):
            return
        op = expr.op
        if isinstance(op, tvm.ir.Op):
            if op.name in KERNEL_CALL_OPS:
                kernels += 1
                callee = expr.args[0]
                if isinstance(callee, relax.GlobalVar) and is_reshape(callee):
                    reshape_kernels += 1
            elif op.name not in NON_KERNEL_OPS and not op.name.startswith(NON_KERNEL_PREFIXES):
                kernels += 1
                unlegalized[op.name] += 1
        elif isinstance(op, relax.GlobalVar) and isinstance(mod[op], prim_func):
            kernels += 1

    for func in graph_functions(mod):
        relax.analysis.post_order_visit(func.body, visit)
    return kernels, reshape_kernels, unlegalized


def analyse(path: str, verbose: bool = False) -> dict:
    """Import, fuse and count one model; return the JSON-ready result dict.

    Raises FrontendError if the model cannot be imported; other exceptions
    come from the fusion passes.
    """
    import tvm

    t0 = time.perf_counter()
    mod = import_relax(path)
    t1 = time.perf_counter()
    relax_ops = count_op_calls(mod)
    fused = fuse(mod)
    t2 = time.perf_counter()
    kernels, reshape_kernels, unlegalized = count_kernel_calls(fused)

    result = {
        "model": os.path.basename(path),
        "relax_ops": sum(relax_ops.values()),
        "fused_functions": kernels,
        "tvm_version": tvm.__version__,
    }
    if verbose:
        prim = [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, _prim_func_type())]
        result.update(
            {
                "kernels_without_reshape": kernels - reshape_kernels,
                "primfuncs": len(prim),
                "fused_primfuncs": sum(1 for n in prim if n.startswith("fused_")),
                "unlegalized_ops": dict(unlegalized),
                "relax_op_histogram": dict(relax_ops.most_common()),
                "import_s": round(t1 - t0, 3),
                "fuse_s": round(t2 - t1, 3),
            }
        )
    return result


def _prim_func_type():
    """Return the TIR ``PrimFunc`` class (``tvm.tirx`` since 0.27, ``tvm.tir`` before)."""
    try:
        from tvm.tirx import PrimFunc
    except ImportError:
        from tvm.tir import PrimFunc
    return PrimFunc


def _one_line(err: BaseException) -> str:
    """Format ``err`` as ``Type: first meaningful line of its message``."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="MODEL", help=".tflite file(s)")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="add per-model details and timings"
    )
    args = parser.parse_args(argv)

    try:
        import tflite  # noqa: F401
        import tvm  # noqa: F401
    except ImportError as err:
        print(f"tvm_fusion: {err} (run with the TVM venv's python)", file=sys.stderr)
        return 2

    status = 0
    for path in args.models:
        try:
            result = analyse(path, verbose=args.verbose)
        except FrontendError as err:
            print(f"tvm_fusion: {path}: frontend cannot import: {err}", file=sys.stderr)
            status = 2
            continue
        except Exception as err:  # noqa: BLE001 - report and go on
            print(f"tvm_fusion: {path}: fusion failed: {_one_line(err)}", file=sys.stderr)
            status = 3 if status == 0 else status
            continue
        print(json.dumps(result), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
