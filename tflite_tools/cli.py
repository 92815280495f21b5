"""The `tflite_tools` command line.

Every command turns a bad input into one line on stderr and exit code 2 (the code argparse uses
for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Sequence

# The CLI is the outermost layer: it imports every stage; no stage imports it.
from fusion.pipeline import plan_model
from fusion.report import format_summary, to_dot
from halide_gen.profile import HostProfiler
from halide_gen.targets import (BASE_TARGETS, INT8_ROUNDINGS, default_target, with_cpu_precision, with_int8_rounding,
                                with_precision)

from . import __version__
from .aar import package_aar
from .bench import Inputs, benchmark, benchmark_json, format_benchmark, measure_peak_memory
from .fuse import fuse
from .info import format_info, model_info
from .model.atomic import write_bytes_atomic
from .model.errors import ModelError, one_line
from .model.reader import load
from .run import REFERENCE_NAMES, run

# The names --target takes (the variants are --gpu-precision's and --int8-rounding's): halide_gen.targets,
# plain data.
TARGETS = BASE_TARGETS


def cmd_info(args: argparse.Namespace) -> int:
    """Prints inputs, outputs, op histogram, sizes, memory and FLOPs of a model."""
    info = model_info(load(args.model))
    if args.json:
        print(json.dumps({"model": args.model, **info}, indent=2))
    else:
        print(format_info(info, args.model))
    return 0


def cmd_fuse(args: argparse.Namespace) -> int:
    """Rewrites and plans a model; without --plan-only also compiles and packages it into -o OUT."""
    if not args.plan_only and not args.out:
        raise ModelError("fuse: say where to write the delegate (-o OUT), or --plan-only to print the plan")
    if args.plan_only and args.shape:
        raise ModelError("fuse: --shape compiles kernels at other input shapes, which --plan-only does not")
    if args.dot:
        _check_dot_path(args.dot)  # before the work, not after it
    trace = (lambda line: print(f"[rewrite] {line}", file=sys.stderr)) if args.verbose else None
    cost = None
    if args.cost == "profile":
        cost = HostProfiler()
    if not args.plan_only:
        try:
            target = with_precision(with_cpu_precision(args.target or default_target(), args.cpu_precision),
                                    args.gpu_precision)
            target = with_int8_rounding(target, args.int8_rounding)
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        result = fuse(args.model, args.out, target=target, fast_math=args.fast_math, measure=args.measure,
                      cost=cost, progress=_progress_printer(), debug_runtime=args.debug_runtime,
                      autoschedulers=args.autoschedulers, emit_asm=args.emit_asm, shapes=args.shape, trace=trace)
        if args.dot:
            write_dot(to_dot(result.summary), args.dot)
        with_kernel = [k for k in result.kernels if k.kernel]
        written = [p for p in (result.model, result.library, result.android_project, result.plan_json,
                               result.report_md) if p is not None]
        if args.json:  # plan.json's summary, and what was written
            print(json.dumps({"model": args.model, "out": str(result.out), "written": [str(p) for p in written],
                              "kernels": len(with_kernel), "claimed_by_default": sum(k.profitable for k in result.kernels),
                              "seconds": round(result.seconds, 2), "decoders": result.decoders,
                              **result.summary.to_json()}, indent=2))
            return 0
        print(f"{args.model}: {len(result.kernels)} blocks, {len(with_kernel)} with Halide kernels "
              f"({result.claimable_nodes} operators), {sum(k.profitable for k in result.kernels)} claimed by default; "
              f"{result.seconds:.1f} s")
        for path in written:
            print(f"  wrote {path}")
        if args.explain:
            print(format_summary(result.summary, args.model, explain=True))
        return 0
    summary = plan_model(load(args.model), fast_math=args.fast_math, cost=cost, trace=trace)
    if args.dot:
        write_dot(to_dot(summary), args.dot)
    if args.json:
        print(json.dumps({"model": args.model, **summary.to_json()}, indent=2))
    else:
        print(format_summary(summary, args.model, explain=args.explain))
    return 0


def _progress_printer() -> Callable[[int, int, str], None]:
    """Progress on stderr: one rewritten line on a terminal, a line per step otherwise, each in one
    write (print writes a line and its end apart: a Ctrl-C between them left the next message on the
    progress line)."""
    tty = sys.stderr.isatty()

    def show(done: int, total: int, what: str) -> None:
        line = f"[{done:>{len(str(total))}}/{total}] {what}"
        sys.stderr.write((f"\r\033[K{line}" + ("" if done < total else "\n")) if tty else line + "\n")
        sys.stderr.flush()

    return show


# The most interpreter threads `run` and `bench` start: the delegate's own num_threads cap
# (delegate/src/options.cc). Thousands exhausted the machine's thread limit.
MAX_THREADS = 256


def _check_threads(command: str, threads: int) -> None:
    if not 1 <= threads <= MAX_THREADS:
        raise ModelError(f"{command}: --threads must be from 1 to {MAX_THREADS}, got {threads}")


def delegate_options(items: Sequence[str], flag: str) -> dict[str, str]:
    """Delegate options from KEY=VALUE items, or benchmark_model's `key:value;key:value` strings."""
    options = {}
    for item in items:
        for pair in filter(None, item.split(";")):
            key, sep, value = pair.partition("=") if "=" in pair else pair.partition(":")
            if not sep or not key:
                raise ModelError(f"{flag} {item!r}: expected KEY=VALUE or key:value;key:value")
            options[key.strip()] = value.strip()
    return options


def cmd_run(args: argparse.Namespace) -> int:
    """Runs a model (through a delegate if given) and compares its outputs with LiteRT's reference."""
    _check_threads("run", args.threads)
    options = delegate_options(args.option, "--option")
    result = run(args.model, delegate=args.delegate, inputs=args.inputs, threads=args.threads, options=options,
                 seed=args.seed)
    if args.json:
        print(json.dumps({"model": args.model, "ok": result.ok, "claims": result.claims, "rtol": result.rtol,
                          "reference": result.reference, "outputs": [vars(e) for e in result.errors]}, indent=2))
    else:
        if result.claims is not None:
            c = result.claims
            print(f"delegate: claimed {len(c['claimed_blocks'])} blocks ({len(c['claimed_nodes'])} nodes), "
                  f"declined {len(c['declined'])}")
            for d in c["declined"]:
                print(f"  declined {d['block']}: {d['reason']}")
            others = {name: line for name, line in c.get("subgraphs", {}).items() if line.get("subgraph", 0) != 0}
            if others:
                print("  other subgraphs (prepared, not run): " + ", ".join(
                    f"{name} {len(line['claimed_blocks'])} blocks" for name, line in others.items()))
        for e in result.errors:
            stock = f" (LiteRT + XNNPACK alone: {e.stock_max_abs:.3g})" if e.stock_max_abs is not None else ""
            own = f", dynamic-range tolerance {e.rtol:.3g}" if e.rtol != result.rtol else ""
            print(f"{e.name}: max abs error {e.max_abs:.3g}, max rel error {e.max_rel:.3g}{own} "
                  f"{'ok' if e.ok else 'OUTSIDE TOLERANCE'}{stock}")
        if result.reference:
            print(f"reference: {REFERENCE_NAMES[result.reference]}")
        print(f"tolerance: max|out - ref| <= {result.rtol:g} * max|ref| (float), 1 step or no more than LiteRT + XNNPACK "
              "alone (int8, and float dequantized from int8), exact (other integers)")
    return 1 if args.compare and not result.ok else 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Times LiteRT + XNNPACK, LiteRT builtin and (with --delegate) our delegate, interleaved."""
    _check_threads("bench", args.threads)
    if args.runs < 1 or args.warmup < 0:
        raise ModelError("bench: --runs must be at least 1, --warmup at least 0")
    if (args.delegate_options or args.require_claims) and not args.delegate:
        raise ModelError("bench: --delegate-options and --require-claims need --delegate LIB")
    inputs = Inputs(tuple(args.inputs), args.seed, _layer_shapes(args.input_layer_shape))
    options = delegate_options(args.delegate_options, "--delegate-options") if args.delegate_options else None
    with tempfile.TemporaryDirectory(prefix="dnnfusion-bench-") as tmp:
        claims = Path(tmp) / "claims.jsonl" if args.require_claims else None
        timings = benchmark(args.model, args.delegate, args.threads, args.runs, args.warmup, _progress_printer(),
                            inputs, cold=args.cold, options=options, report=claims)
        if claims is not None and not any(json.loads(line)["claimed_nodes"] for line in
                                          (claims.read_text().splitlines() if claims.exists() else [])):
            raise ModelError(f"bench: the delegate claimed nothing in {args.model} (--require-claims)")
    if args.memory:
        measure_peak_memory(timings, args.model, args.delegate, args.threads, inputs, options)
    if args.json:
        print(json.dumps(benchmark_json(timings, args.model, args.threads, args.cold), indent=2))
    else:
        print(format_benchmark(timings, args.model, args.threads, args.cold))
    return 0


def _layer_shapes(text: str | None) -> tuple[tuple[int, ...], ...]:
    """benchmark_model's --input_layer_shape: each input's dims, comma-separated, inputs ':'-separated."""
    if not text:
        return ()
    try:
        shapes = tuple(tuple(int(d) for d in part.split(",")) for part in text.split(":"))
    except ValueError:
        raise ModelError(f"bench: --input_layer_shape {text!r}: expected dims like 4,224,224,3[:1,20]") from None
    if any(d < 1 for dims in shapes for d in dims):
        raise ModelError(f"bench: --input_layer_shape {text!r}: every dimension must be at least 1")
    return shapes


def cmd_aar(args: argparse.Namespace) -> int:
    """Packages the built Android libraries of fuse output folders into one AAR."""
    print(f"  wrote {package_aar([Path(o) for o in args.outs], Path(args.output))}")
    return 0


def _check_dot_path(path: str) -> None:
    """ModelError when `path` names a rendered format (.svg / .png / .pdf) and Graphviz is missing."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt in ("svg", "png", "pdf") and shutil.which("dot") is None:
        raise ModelError(f"{path}: rendering .{fmt} needs Graphviz `dot` (apt-get install graphviz); use a .dot name")


def write_dot(text: str, path: str) -> None:
    """Writes Graphviz text, or renders it when `path` ends in .svg / .png / .pdf."""
    target = Path(path)
    fmt = target.suffix.lstrip(".").lower()
    if fmt not in ("svg", "png", "pdf"):
        write_bytes_atomic(target, text.encode())
        return
    _check_dot_path(path)
    dot = shutil.which("dot")
    rendered = subprocess.run([dot, f"-T{fmt}"], input=text.encode(), capture_output=True, check=False)
    if rendered.returncode != 0:
        raise ModelError(f"{path}: dot failed: {rendered.stderr.decode(errors='replace').strip()}")
    write_bytes_atomic(target, rendered.stdout)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="tflite_tools",
        description="Inspect TensorFlow Lite models and fuse them into Halide kernels (dnnfusion).",
    )
    parser.add_argument("--version", action="version", version=f"dnnfusion {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = sub.add_parser("info", help="summarise a model: I/O, ops, memory, FLOPs")
    info.add_argument("model", metavar="MODEL", help="path to a .tflite file")
    info.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    info.set_defaults(run=cmd_info)

    fuse = sub.add_parser("fuse", help="rewrite the graph and plan fused blocks (DNNFusion)")
    fuse.add_argument("model", metavar="MODEL", help="path to a .tflite file")
    fuse.add_argument("--plan-only", action="store_true", help="stop after planning: print the blocks")
    fuse.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    fuse.add_argument("--dot", metavar="FILE", help="draw the graph coloured by block (.dot, or .svg/.png with Graphviz)")
    fuse.add_argument("--fast-math", action="store_true", help="also apply rewrites that change float rounding")
    fuse.add_argument("--explain", action="store_true", help="report how often each rewrite rule fired")
    fuse.add_argument("--verbose", action="store_true", help="trace each rewrite and the graph after each pass")
    fuse.add_argument("--cost", choices=["roofline", "profile"], default="roofline",
                      help="what answers yellow Table 3 cells: the static roofline, or Halide kernels timed here")
    fuse.add_argument("-o", "--out", metavar="OUT", help="folder for model.fused.tflite, the delegate, plan.json, report.md")
    fuse.add_argument("--target", choices=sorted(TARGETS),
                      help="where the kernels run (default: $DNNFUSION_TARGET, or host: x86-64 with "
                           "AVX-512/AVX2/baseline; host-native: only this CPU's, built five times faster)")
    fuse.add_argument("--gpu-precision", choices=["fp32", "fp16"], default="fp32",
                      help="GPU targets: store the tensors a block computes in half precision (math and sums "
                           "stay fp32; outputs within 1e-2 of LiteRT's range instead of 1e-4)")
    fuse.add_argument("--cpu-precision", choices=["fp32", "fp16"], default="fp32",
                      help="ARMv8.2 CPU targets: compute in half precision as XNNPACK's fp16 kernels do (tensors, "
                           "weights, products and sums in fp16: 8 lanes an FMA; outputs within the fp16 tolerance "
                           "the README states)")
    fuse.add_argument("--int8-rounding", choices=INT8_ROUNDINGS,
                      help="how int8 convolutions and matrix products requantize: as LiteRT's reference kernels, bit "
                           "for bit (default on ARM), or in float32 as XNNPACK does, within 1 LSB of them (default on "
                           "x86, where the fixed point costs 5x the instructions)")
    fuse.add_argument("--shape", action="append", default=[], metavar="[SIGNATURE:]INPUT=DIMS[,INPUT=DIMS]",
                      help="also compile the kernels at these input shapes (e.g. x=4x224x224x3), which the delegate "
                           "runs when the model is resized to them; repeat for more")
    fuse.add_argument("--measure", action="store_true",
                      help="time every block against LiteRT+XNNPACK here; claim only faster ones by default")
    fuse.add_argument("--autoschedulers", action="store_true",
                      help="time Halide's autoschedulers and the template variants against the templates per block "
                           "where the target's kernels run here (CPU; host-opencl/host-vulkan: the GPU API's "
                           "device); compile the fastest")
    fuse.add_argument("--emit-asm", action="store_true",
                      help="keep each kernel's assembly (.s) and Halide statement (.stmt) in OUT/asm/<block>/")
    fuse.add_argument("--debug-runtime", action="store_true",
                      help="link Halide's debug runtime: traces device copies and kernel launches (log_level:verbose)")
    fuse.set_defaults(run=cmd_fuse)

    run = sub.add_parser("run", help="run a model, optionally with a delegate, and compare with LiteRT")
    run.add_argument("model", metavar="MODEL", help="path to a .tflite file (model.fused.tflite with a delegate)")
    run.add_argument("--delegate", metavar="LIB", help="a dnnfusion delegate library (lib<model>_dnnfusion.so)")
    run.add_argument("--inputs", nargs="+", default=[], metavar="NPY",
                     help="one .npy per input (default: random, integers under any table they index)")
    run.add_argument("--compare", action="store_true", help="exit 1 when an output is outside the tolerance")
    run.add_argument("--threads", "--num_threads", type=int, default=1, help="interpreter threads (default 1)")
    run.add_argument("--option", "--delegate-options", action="append", default=[], metavar="KEY=VALUE",
                     help="a delegate option (num_threads, log_level, claim, report, ...), or benchmark_model's "
                          "'key:value;key:value'; repeatable")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.set_defaults(run=cmd_run)

    bench = sub.add_parser("bench", help="latency side by side: LiteRT+XNNPACK, LiteRT builtin, our delegate")
    bench.add_argument("model", metavar="MODEL", help="path to a .tflite file (model.fused.tflite with a delegate)")
    bench.add_argument("--delegate", "--external_delegate_path", metavar="LIB",
                       help="a dnnfusion delegate library: adds claim:all and claim:profitable")
    bench.add_argument("--delegate-options", "--external_delegate_options", action="append", default=[],
                       metavar="'key:value;key:value'",
                       help="the delegate's options, as benchmark_model takes them: one contender, dnnfusion, "
                            "with exactly these (instead of claim:all and claim:profitable)")
    bench.add_argument("--require-claims", action="store_true",
                       help="exit 2 when the delegate claims nothing (benchmark tools' require-full-delegation check)")
    bench.add_argument("--threads", "--num_threads", type=int, default=1, help="threads for every contender (default 1)")
    bench.add_argument("--runs", "--num_runs", type=int, default=50, help="timed runs per contender (default 50)")
    bench.add_argument("--warmup", "--warmup_runs", type=int, default=5,
                       help="untimed runs per contender first (default 5)")
    bench.add_argument("--cold", action="store_true",
                       help="one invoke per turn, each after another contender's (default: turns of 10 invokes, "
                            "after one untimed, as an app running one model sees)")
    bench.add_argument("--inputs", nargs="+", default=[], metavar="NPY",
                       help="one .npy per input (default: random, integers under any table they index)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    bench.add_argument("--input_layer_shape", "--input-layer-shape", metavar="DIMS[:DIMS]",
                       help="resize the inputs first, as benchmark_model does: 4,224,224,3 (one per input, ':' between)")
    bench.add_argument("--memory", action="store_true", help="also measure peak memory, one process per contender")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(run=cmd_bench)

    aar = sub.add_parser("aar", help="package built arm64-android delegates (CPU, OpenCL, Vulkan) as an Android AAR")
    aar.add_argument("outs", nargs="+", metavar="OUT", help="fuse --target arm64-android* output folders, one model")
    aar.add_argument("-o", "--output", required=True, metavar="FILE.aar", help="the AAR to write")
    aar.set_defaults(run=cmd_aar)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tflite_tools` console script; returns the exit code."""
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            args = build_parser().parse_args(argv)
            run: Callable[[argparse.Namespace], int] = args.run
            code = run(args)
            sys.stdout.flush()  # here, where a reader gone away is handled, not at the interpreter's exit
            return code
        except ModelError as exc:
            print(f"tflite_tools: error: {exc}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            # The reader went away (`| head`): nothing is wrong and no one is left to tell. Python would
            # flush stdout again at exit and complain: it goes to /dev/null. 141: a shell's SIGPIPE status.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except OSError as exc:  # the machine's side: a cache or output folder, a full disk, no compiler
            print(f"tflite_tools: error: {_os_error_line(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            # On a terminal the message replaces an unfinished progress line.
            sys.stderr.write(("\r\033[K" if sys.stderr.isatty() else "") + "tflite_tools: interrupted\n")
            return 130


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line each (a damaged cache entry being rebuilt, say), not Python's two."""
    print(f"tflite_tools: warning: {one_line(str(message))}", file=sys.stderr)


def _os_error_line(exc: OSError) -> str:
    """An OSError as a user reads it: what failed, on which path."""
    what = exc.strerror or str(exc)
    return f"{what}: {exc.filename}" if exc.filename else what


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
