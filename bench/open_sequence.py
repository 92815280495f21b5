"""A BERT-base-width encoder whose sequence is open, timed at prompt lengths it was not compiled for.

    python bench/open_sequence.py build --out bench/corpus-sequence     # needs TensorFlow
    python bench/open_sequence.py speed bench/corpus-sequence [--compiled 128 ...] [--lengths 128 77 200 384]

`build` converts (random weights, offline) two encoder layers of BERT-base's widths (768 features,
12 heads of 64, a 3072-wide tanh-GELU feed-forward) over an input [1, None, 768] whose reshapes say
-1 for the length, so LiteRT sizes the model at any length when it is prepared. `speed` fuses it for
the host with `--shape x=1x<compiled>x768` for each length given, then at each length resizes every contender's input and
times LiteRT + XNNPACK against our delegate under claim:all and the default policy, interleaved in
one process (tflite_tools.bench). The delegate runs the blocks that keep the tokens apart on windows
of the compiled length (tflite_tools.windows) and leaves attention, which mixes them, to TFLite at
other lengths, taking the graph of the compiled length that computes the fewest extra tokens; the
table says how many of the fused graph's nodes it claimed at each length.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "encoder_open_768.tflite"
WIDTH, HEADS, HIDDEN, LAYERS = 768, 12, 3072, 2


def build(out: Path) -> Path:
    """Converts the open-sequence encoder into `out` (kept where it is there already)."""
    import numpy as np
    import tensorflow as tf

    path = out / MODEL
    if path.exists():
        return path
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> tf.Tensor:
        return tf.constant((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    class Encoder(tf.Module):
        def __init__(self):
            super().__init__()
            self.layers = [dict(q=weight(WIDTH, WIDTH), k=weight(WIDTH, WIDTH), v=weight(WIDTH, WIDTH),
                                o=weight(WIDTH, WIDTH), up=weight(WIDTH, HIDDEN), down=weight(HIDDEN, WIDTH),
                                b=tf.constant(np.zeros(HIDDEN, np.float32)))
                           for _ in range(LAYERS)]

        @tf.function(input_signature=[tf.TensorSpec([1, None, WIDTH], tf.float32)])
        def __call__(self, x):
            def norm(h):
                mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
                return (h - mean) * tf.math.rsqrt(variance + 1e-12)

            for w in self.layers:
                def heads(m):
                    return tf.transpose(tf.reshape(tf.matmul(x, m), [1, -1, HEADS, WIDTH // HEADS]), [0, 2, 1, 3])

                scores = tf.matmul(heads(w["q"]), heads(w["k"]), transpose_b=True) / np.sqrt(WIDTH // HEADS)
                attended = tf.transpose(tf.matmul(tf.nn.softmax(scores), heads(w["v"])), [0, 2, 1, 3])
                x = norm(x + tf.matmul(tf.reshape(attended, [1, -1, WIDTH]), w["o"]))
                x = norm(x + tf.matmul(tf.nn.gelu(tf.matmul(x, w["up"]) + w["b"], approximate=True), w["down"]))
            return x

    encoder = Encoder()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([encoder.__call__.get_concrete_function()], encoder)
    out.mkdir(parents=True, exist_ok=True)
    path.write_bytes(converter.convert())
    return path


def speed(folder: Path, compiled: list[int], lengths: list[int], runs: int) -> None:
    """Fuses the encoder at each of `compiled` tokens and prints the speed table at each of `lengths`."""
    from tflite_tools import bench
    from tflite_tools.fuse import fuse

    result = fuse(folder / MODEL, folder / "fused", cache_dir=folder / "kernels",
                  shapes=[f"x=1x{n}x{WIDTH}" for n in compiled])
    planned = sum(len(k.nodes) for k in result.kernels if k.kernel and k.shapes == result.variants[-1].shapes)
    print(f"{bench.host_line()}; fused at {', '.join(map(str, compiled))} tokens; {planned} nodes in blocks; one thread, "
          f"{runs} runs each, interleaved")
    print("| tokens | XNNPACK ms | ours / XNNPACK (all) | (default) | nodes claimed |")
    print("|---|---|---|---|---|")
    for length in lengths:
        timings = bench.benchmark(str(result.model), str(result.library), threads=1, runs=runs,
                                  inputs=bench.Inputs(shapes=((1, length, WIDTH),)))
        ratio = bench.ratios(timings)
        xnnpack = next(t for t in timings if t.name == "xnnpack")
        claimed = len(_claims_at(result, length)["claimed_nodes"])
        print(f"| {length} | {xnnpack.median / 1000:.1f} | {ratio['dnnfusion-all']:.2f}x | "
              f"{ratio['dnnfusion-profitable']:.2f}x | {claimed} of {planned} |")


def _claims_at(result, length: int) -> dict:
    """The delegate's claims (claim:all) once the model is resized to `length` tokens."""
    from tflite_tools import runtime
    from tflite_tools.run import read_claims

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "claims.jsonl"
        delegate = runtime.load_delegate(str(result.library), options={"claim": "all", "report": str(report)})
        interp = runtime.make_interpreter(result.model, delegates=[delegate])
        interp.resize_tensor_input(interp.get_input_details()[0]["index"], [1, length, WIDTH])
        interp.allocate_tensors()
        return read_claims(report)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: build or speed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=REPO / "bench" / "corpus-sequence")
    s = sub.add_parser("speed")
    s.add_argument("folder", type=Path)
    s.add_argument("--compiled", type=int, nargs="+", default=[128])
    s.add_argument("--lengths", type=int, nargs="+", default=[128, 77, 200, 384])
    s.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    if args.command == "build":
        print(build(args.out))
    else:
        speed(args.folder, args.compiled, args.lengths, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
