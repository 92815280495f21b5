"""What each x86 build's own register tiles are worth: blocks JIT-compiled for one build of the host
library (AVX2 by default) under that build's template parameters and under AVX-512's, which every
build ran before each was scheduled for its own registers.

    python bench/x86_tiles.py [--build avx2|sse2] [--threads 1] [--rounds 9]

Runs on any x86 CPU that has the build's features (an AVX-512 host runs AVX2 code), so the AVX2
build can be measured where no AVX2-only CPU is at hand; LiteRT + XNNPACK pick their kernels by
the CPU itself, so they are not beside these figures. The two kernels of a block are timed in turns
(halide_gen.profile.interleaved_seconds, rounds of at least 0.1 s); times are medians over rounds,
the ratio the median of each round's ratio (below 1: the build's own tiles are faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Halide target strings of the builds measured here, as JIT targets.
BUILDS = {"avx2": "x86-64-linux-avx-avx2-f16c-fma-sse41-jit", "sse2": "x86-64-linux-jit"}


def _float_model(kind: str, shape: tuple[int, ...], channels: int, k: int = 1, then: str | None = None):
    """One FULLY_CONNECTED ([1, rows, depth] -> channels, then `then` if given), CONV_2D or
    DEPTHWISE_CONV_2D (SAME, stride 1, RELU6) on an NHWC input, random weights."""
    import tflite_tools

    rng = np.random.default_rng(0)
    w = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)  # noqa: E731
    b = tflite_tools.ModelBuilder()
    x = b.input("x", list(shape))
    if kind == "FULLY_CONNECTED":
        out = [*shape[:-1], channels]
        y = b.op(kind, [x, b.const("w", w(channels, shape[-1])), b.const("b", w(channels))], out, keep_num_dims=True)
        if then:
            y = b.op(then, [y], out, approximate=True)
    else:
        depthwise = kind == "DEPTHWISE_CONV_2D"
        weights = w(1, k, k, channels) if depthwise else w(channels, k, k, shape[-1])
        y = b.op(kind, [x, b.const("w", weights), b.const("b", w(channels))], [*shape[:-1], channels], padding="SAME",
                 stride_h=1, stride_w=1, fused_activation_function="RELU6", **({"depth_multiplier": 1} if depthwise else {}))
    b.output(y)
    return b.build()


def _int8_model(kind: str, shape: tuple[int, ...], channels: int):
    """An int8 FULLY_CONNECTED or 1x1 CONV_2D with per-channel weights and a bias."""
    import tflite_tools
    from tflite_tools.model.builder import quantization

    rng = np.random.default_rng(0)
    b = tflite_tools.ModelBuilder()
    depth = shape[-1]
    x = b.input("x", list(shape), "int8", quant=quantization(0.03, 7))
    scales = rng.uniform(0.002, 0.01, channels).astype(np.float32)
    weights = rng.integers(-127, 128, (channels, depth) if kind == "FULLY_CONNECTED" else (channels, 1, 1, depth))
    wt = b.const("w", weights.astype(np.int8), quant=quantization(scales, 0, 0))
    bias = b.const("b", rng.integers(-500, 500, channels).astype(np.int32), quant=quantization(0.03 * scales, 0, 0))
    # A sum of `depth` random products lands ~40 steps from zero: not saturated.
    out_q = quantization(0.03 * float(scales.mean()) * (127 / np.sqrt(3)) ** 2 * np.sqrt(depth) / 40, -4)
    options = {} if kind == "FULLY_CONNECTED" else {"padding": "SAME", "stride_h": 1, "stride_w": 1}
    b.output(b.op(kind, [x, wt, bias], [*shape[:-1], channels], quant=out_q, **options))
    return b.build()


def cases() -> dict[str, object]:
    """The blocks timed: a transformer's projections (prefill and decode rows), a CNN's pointwise,
    3x3 and depthwise convolutions, and their int8 forms."""
    return {
        "FULLY_CONNECTED 128 x 768 -> 768": _float_model("FULLY_CONNECTED", (1, 128, 768), 768),
        "FULLY_CONNECTED 128 x 768 -> 3072, GELU (tanh)": _float_model("FULLY_CONNECTED", (1, 128, 768), 3072,
                                                                        then="GELU"),
        "FULLY_CONNECTED 1 x 768 -> 768": _float_model("FULLY_CONNECTED", (1, 1, 768), 768),
        "CONV_2D 1x1 64 -> 384, 28 x 28": _float_model("CONV_2D", (1, 28, 28, 64), 384),
        "CONV_2D 3x3 32 -> 64, 56 x 56": _float_model("CONV_2D", (1, 56, 56, 32), 64, k=3),
        "DEPTHWISE_CONV_2D 3x3 144, 56 x 56": _float_model("DEPTHWISE_CONV_2D", (1, 56, 56, 144), 144, k=3),
        "int8 FULLY_CONNECTED 128 x 768 -> 768": _int8_model("FULLY_CONNECTED", (1, 128, 768), 768),
        "int8 CONV_2D 1x1 64 -> 384, 28 x 28": _int8_model("CONV_2D", (1, 28, 28, 64), 384),
    }


def main(argv: list[str] | None = None) -> int:
    """Prints the table: per block, AVX-512's tiles and the build's own, in ms, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=sorted(BUILDS), default="avx2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    os.environ["HL_NUM_THREADS"] = str(args.threads)

    import halide as hl

    from halide_gen.block import build_block
    from halide_gen.jit import JitKernel
    from halide_gen.profile import interleaved_seconds, random_array
    from halide_gen.schedule import X86, schedule_cpu, template_params
    from halide_gen.targets import target_spec
    from tflite_tools.bench import host_line

    target = hl.Target(BUILDS[args.build])
    own = template_params(target_spec("host"), "template", target)
    print(f"{host_line()} {args.build} code, {args.threads} thread(s).\n")
    print(f"| block | AVX-512's tiles ms | {args.build}'s own ms | ratio |")
    print("|---|---|---|---|")
    for name, model in cases().items():
        sg = model.main
        rng = np.random.default_rng(1)
        data = {id(t): random_array(t, rng) for t in sg.inputs}
        runs = []
        for params in (X86, own):
            kernel = JitKernel(build_block("tiles", sg.operators, sg.outputs), target=target,
                               schedule=lambda k, p=params: schedule_cpu(k, p))
            kernel.bind(kernel.inputs_from(data))
            kernel.run()  # the first call allocates
            runs.append(kernel.run)
        wide, narrow = interleaved_seconds(runs, args.rounds, 0.1)
        ratio = statistics.median(n / w for w, n in zip(wide, narrow))
        print(f"| {name} | {statistics.median(wide) * 1e3:.3f} | {statistics.median(narrow) * 1e3:.3f} | {ratio:.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
