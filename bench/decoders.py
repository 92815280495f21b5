"""The decoder corpus: Llama-, Qwen- and Gemma-style language-model decoders as on-device apps ship
them (prefill and decode signatures, an external KV cache passed in and out and updated with
DYNAMIC_UPDATE_SLICE at the input position, RoPE computed from it, RMSNorm, a gated MLP,
grouped-query attention under a causal mask), random weights, in float32, dynamic-range int8
(TFLite's converter) and int4 (ai-edge-quantizer's dynamic int4 recipes: per channel, and per block of
32 input channels).

    python bench/decoders.py build [--only NAME ...]     # needs TensorFlow (+ ai-edge-quantizer for int4)
    python bench/decoders.py check [--only NAME ...]     # fuse, claims per signature, greedy generation
    python bench/decoders.py speed [--only NAME ...] [--threads 1 2] [--runs 5]

`build` writes bench/corpus-decoders/<name>[_dynamic_range|_int4|_int4_blockwise].tflite (ignored; run it with a
venv that has tensorflow-cpu and ai-edge-quantizer). `check` fuses each model for the host, reports
what the delegate claims in every signature under claim:all and the default policy, and generates
GENERATED tokens greedily (prefill the prompt, then one decode per token) with the delegate and with
stock LiteRT (its reference kernels, and LiteRT + XNNPACK): the tokens must agree. `speed` times
prefill (tokens/s at each prefill signature's length) and decode (tokens/s with the cache filled to
each of DECODE_POSITIONS) against LiteRT + XNNPACK, interleaved in one process per thread count.
Kernels are cached in bench/corpus-decoders/kernels/ between the two. The decode cost does not depend
on the position: the attention reads the whole cache under a mask, as the converted models compute it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FOLDER = REPO / "bench" / "corpus-decoders"
GENERATED = 32
# Kernels of the corpus, kept between `check` and `speed` (a 135M decoder compiles for minutes).
CACHE = FOLDER / "kernels"
DECODE_POSITIONS = (128, 1000)


@dataclasses.dataclass(frozen=True)
class Decoder:
    """A decoder's shape: `style` picks the family's details (llama: SwiGLU, RMSNorm x w; qwen: and
    biases on q, k, v; gemma: GELU-tanh gate, RMSNorm x (1 + w), embeddings scaled by sqrt(hidden))."""

    style: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    cache: int  # positions the KV cache holds
    prefill: tuple[int, ...]  # one prefill signature per length

    @property
    def parameters(self) -> int:
        """Weights, embeddings (tied with the output projection) included."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.vocab * self.hidden + self.layers * (attention + 3 * self.hidden * self.ffn + 2 * self.hidden)


DECODERS = {
    # SmolLM-135M's shape: 30 layers of 576, 9 query heads over 3 key/value heads.
    "llama_135m": Decoder("llama", 49152, 576, 30, 9, 3, 64, 1536, 1024, (128, 512)),
    # A Qwen2-style decoder scaled to ~60M: biases on q, k, v; 8 query heads over 2.
    "qwen_60m": Decoder("qwen", 32768, 512, 12, 8, 2, 64, 1536, 1024, (128, 512)),
    # A Gemma-style decoder (~90M): one key/value head, heads of 256, GELU-tanh gate.
    "gemma_90m": Decoder("gemma", 32768, 640, 10, 4, 1, 256, 2048, 1024, (128, 512)),
}
# The precisions each decoder is built in: file suffix -> how the float model is quantized.
PRECISIONS = ("", "_dynamic_range", "_int4", "_int4_blockwise")


def module(tf, d: Decoder, seed: int = 0):
    """The decoder as a tf.Module whose `signatures()` are prefill_<len> (tokens, input_pos, caches ->
    caches) and decode (one token -> logits of the next, caches)."""
    rng = np.random.default_rng(seed)
    half = d.head_dim // 2
    inverse_frequency = (1.0 / 10000 ** (np.arange(half) * 2 / d.head_dim)).astype(np.float32)
    cache_spec = [tf.TensorSpec([1, d.cache, d.kv_heads, d.head_dim], tf.float32, name=f"{kind}_cache_{i}")
                  for i in range(d.layers) for kind in ("k", "v")]

    def weight(*shape: int, scale: float | None = None):
        scale = 1 / math.sqrt(shape[0]) if scale is None else scale
        return tf.Variable((rng.standard_normal(shape) * scale).astype(np.float32))

    def norm_scale():
        return tf.Variable((1 + 0.1 * rng.standard_normal(d.hidden)).astype(np.float32) - (d.style == "gemma"))

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.embedding = weight(d.vocab, d.hidden, scale=1.0)
            self.layer_weights = []
            for _ in range(d.layers):
                w = {"attention_norm": norm_scale(), "mlp_norm": norm_scale(),
                     "q": weight(d.hidden, d.heads * d.head_dim), "k": weight(d.hidden, d.kv_heads * d.head_dim),
                     "v": weight(d.hidden, d.kv_heads * d.head_dim), "o": weight(d.heads * d.head_dim, d.hidden),
                     "gate": weight(d.hidden, d.ffn), "up": weight(d.hidden, d.ffn), "down": weight(d.ffn, d.hidden)}
                if d.style == "qwen":
                    w.update({f"{p}_bias": weight(n * d.head_dim, scale=0.1)
                              for p, n in (("q", d.heads), ("k", d.kv_heads), ("v", d.kv_heads))})
                self.layer_weights.append(w)
            self.final_norm = norm_scale()

        def rms_norm(self, x, scale):
            x = x * tf.math.rsqrt(tf.reduce_mean(x * x, axis=-1, keepdims=True) + 1e-6)
            return x * (1 + scale if d.style == "gemma" else scale)

        def step(self, tokens, input_pos, caches):
            count = tokens.shape[1]
            x = tf.gather(self.embedding, tokens)
            if d.style == "gemma":
                x = x * math.sqrt(d.hidden)
            positions = tf.cast(input_pos[0] + tf.range(count), tf.float32)
            angle = positions[:, None] * inverse_frequency[None, :]
            cos, sin = tf.cos(angle)[None, :, None, :], tf.sin(angle)[None, :, None, :]

            def rope(t):
                first, second = t[..., :half], t[..., half:]
                return tf.concat([first * cos - second * sin, second * cos + first * sin], axis=-1)

            visible = tf.range(d.cache)[None, :] <= (input_pos[0] + tf.range(count))[:, None]
            mask = (1 - tf.cast(visible, tf.float32)) * -1e9
            start = tf.stack([0, input_pos[0], 0, 0])
            updated = []
            for i, w in enumerate(self.layer_weights):
                h = self.rms_norm(x, w["attention_norm"])

                def project(name, heads):
                    y = tf.matmul(h, w[name])
                    if d.style == "qwen":
                        y = y + w[f"{name}_bias"]
                    return tf.reshape(y, [1, count, heads, d.head_dim])

                q, k, v = rope(project("q", d.heads)), rope(project("k", d.kv_heads)), project("v", d.kv_heads)
                k_cache = xla_dynamic_update_slice(caches[2 * i], k, start)
                v_cache = xla_dynamic_update_slice(caches[2 * i + 1], v, start)
                updated += [k_cache, v_cache]
                groups = tf.reshape(q, [1, count, d.kv_heads, d.heads // d.kv_heads, d.head_dim])
                scores = tf.einsum("btkgd,bskd->bkgts", groups, k_cache) / math.sqrt(d.head_dim) + mask
                attended = tf.einsum("bkgts,bskd->btkgd", tf.nn.softmax(scores), v_cache)
                x = x + tf.matmul(tf.reshape(attended, [1, count, d.heads * d.head_dim]), w["o"])
                h = self.rms_norm(x, w["mlp_norm"])
                gate = tf.matmul(h, w["gate"])
                gate = tf.nn.gelu(gate, approximate=True) if d.style == "gemma" else tf.nn.silu(gate)
                x = x + tf.matmul(gate * tf.matmul(h, w["up"]), w["down"])
            return x, updated

        def caches_out(self, updated) -> dict:
            return {spec.name: c for spec, c in zip(cache_spec, updated)}

        def signatures(self) -> dict:
            position = tf.TensorSpec([1], tf.int32, name="input_pos")
            found = {}
            for length in d.prefill:
                @tf.function(input_signature=[tf.TensorSpec([1, length], tf.int32, name="tokens"), position,
                                              cache_spec])
                def prefill(tokens, input_pos, caches):
                    return self.caches_out(self.step(tokens, input_pos, caches)[1])
                found[f"prefill_{length}"] = prefill

            @tf.function(input_signature=[tf.TensorSpec([1, 1], tf.int32, name="tokens"), position, cache_spec])
            def decode(tokens, input_pos, caches):
                x, updated = self.step(tokens, input_pos, caches)
                logits = tf.matmul(self.rms_norm(x[:, -1], self.final_norm), self.embedding, transpose_b=True)
                return {"logits": logits, **self.caches_out(updated)}
            found["decode"] = decode
            return found

    from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice as xla_dynamic_update_slice
    return Model()


def convert(tf, d: Decoder, precision: str, saved: Path) -> bytes:
    """The decoder as a TFLite flatbuffer in one of PRECISIONS."""
    model = module(tf, d)
    signatures = model.signatures()
    tf.saved_model.save(model, str(saved), signatures=signatures)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved), signature_keys=list(signatures))
    if precision == "_dynamic_range":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    flat = converter.convert()
    if precision.startswith("_int4"):
        from ai_edge_quantizer import qtyping, quantizer, recipe, recipe_manager
        qt = quantizer.Quantizer(flat)
        if precision == "_int4_blockwise":
            blocks = recipe_manager.RecipeManager()
            blocks.add_dynamic_config(regex=".*", operation_name=qtyping.TFLOperationName.FULLY_CONNECTED, num_bits=4,
                                      granularity=qtyping.QuantGranularity.BLOCKWISE_32)
            qt.load_quantization_recipe(blocks.get_quantization_recipe())
        else:
            qt.load_quantization_recipe(recipe.dynamic_wi4_afp32())
        flat = qt.quantize().quantized_model
    return bytes(flat)


def build(out: Path, only: Sequence[str]) -> None:
    """Converts every decoder in every precision into `out`, skipping files already there."""
    import tensorflow as tf

    out.mkdir(parents=True, exist_ok=True)
    for name in only or DECODERS:
        for precision in PRECISIONS:
            path = out / f"{name}{precision}.tflite"
            if path.exists():
                continue
            with tempfile.TemporaryDirectory(prefix="dnnfusion-decoder-") as tmp:
                try:
                    path.write_bytes(convert(tf, DECODERS[name], precision, Path(tmp) / "saved"))
                except Exception as exc:  # one the converter refuses does not stop the others
                    print(f"decoders: {path.name}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                    continue
            print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB)", file=sys.stderr, flush=True)


# --- generation ---

def _caches(runner: Any) -> dict[str, np.ndarray]:
    """Empty caches for a signature runner's cache inputs."""
    return {name: np.zeros(detail["shape"], detail["dtype"])
            for name, detail in runner.get_input_details().items() if "_cache_" in name}


def _prefill_length(interp: Any) -> int:
    """The shortest prefill signature's token count."""
    return min(int(k.split("_")[1]) for k in interp.get_signature_list() if k.startswith("prefill_"))


def prompt(interp: Any, seed: int = 0) -> np.ndarray:
    """A seeded prompt one token longer than the shortest prefill."""
    vocab = interp.get_signature_runner("decode").get_output_details()["logits"]["shape"][-1]
    return np.random.default_rng(seed).integers(0, vocab, _prefill_length(interp) + 1).astype(np.int32)


def greedy(interp: Any, tokens: np.ndarray, steps: int = GENERATED) -> tuple[list[int], list[float]]:
    """Generates `steps` tokens greedily after `tokens` (as long as a prefill signature plus one):
    prefill all but the last, then decode one token at a time. Returns the tokens and, per step,
    the gap between the two largest logits (how far a rounding is from changing the token)."""
    prefill, decode = interp.get_signature_runner(f"prefill_{len(tokens) - 1}"), interp.get_signature_runner("decode")
    caches = prefill(tokens=tokens[None, :-1], input_pos=np.zeros(1, np.int32), **_caches(prefill))
    token, position, generated, margins = int(tokens[-1]), len(tokens) - 1, [], []
    for _ in range(steps):
        out = decode(tokens=np.array([[token]], np.int32), input_pos=np.array([position], np.int32), **caches)
        logits = out.pop("logits")[0]
        caches, token, position = out, int(np.argmax(logits)), position + 1
        top = np.sort(logits)[-2:]
        generated.append(token)
        margins.append(float(top[1] - top[0]))
    return generated, margins


# --- check ---

def check_model(path: Path, work: Path) -> dict:
    """One row: fuse, claims per signature, and greedy generation with the delegate against stock."""
    from corpus import fuse_for_row  # beside this script
    from tflite_tools.bench import Contender
    from tflite_tools.run import read_claims, reference_resolver

    row: dict = {"model": path.stem, "note": "", "claims": {}, "tokens": {}}
    result = fuse_for_row(path, work, row, CACHE)
    if result is None:
        return row
    planned = {}
    for k in result.kernels:
        planned[k.subgraph] = planned.get(k.subgraph, 0) + len(k.nodes)
    stock = Contender("reference", str(path), reference_resolver(path)).interpreter(1)
    words = prompt(stock)
    row["reference"], row["margin"] = greedy(stock, words)
    row["margin"] = min(row["margin"])
    row["tokens"]["xnnpack"] = greedy(Contender("xnnpack", str(path)).interpreter(1), words)[0]
    for claim in ("all", None):
        report = work / f"{path.stem}.{claim or 'default'}.jsonl"
        report.unlink(missing_ok=True)
        ours = Contender("dnnfusion", str(result.model), delegate=str(result.library), claim=claim,
                         options=(("report", str(report)),)).interpreter(1)
        row["tokens"][claim or "default"] = greedy(ours, words)[0]
        claims = read_claims(report)["subgraphs"]
        row["claims"][claim or "default"] = {
            name: (len(line["claimed_nodes"]), sorted({d["reason"] for d in line["declined"]}))
            for name, line in claims.items()}
    row["nodes"] = {name: planned.get(line["subgraph"], 0) for name, line in claims.items()}
    return row


def check_line(row: dict) -> str:
    """One model's row of the check table."""
    if "reference" not in row:
        return f"| {row['model']} | - | - | - | {row['note']} |"

    def claimed(policy: str) -> str:
        return ", ".join(f"{name} {n}/{row['nodes'][name]}" for name, (n, _) in sorted(row["claims"][policy].items()))

    same = {who: sum(a == b for a, b in zip(tokens, row["reference"])) for who, tokens in row["tokens"].items()}
    declined = sorted({r for p in row["claims"].values() for _, reasons in p.values() for r in reasons})
    note = "; ".join(declined) or row["note"]
    return (f"| {row['model']} | {claimed('all')} | {claimed('default')} | "
            f"{same['all']}/{GENERATED}, {same['default']}/{GENERATED} (XNNPACK {same['xnnpack']}/{GENERATED}); "
            f"smallest top-2 logit gap {row['margin']:.3g} | {note} |")


CHECK_HEAD = ("| model | claimed nodes per signature, claim:all | default policy | greedy tokens equal to the "
              "reference kernels': ours all, default | declined |\n|---|---|---|---|---|")


# --- speed ---

def _signature_invoke(interp: Any, name: str, position: int, seed: int = 0) -> Callable[[], None]:
    """Sets a signature's inputs once (seeded tokens, `position`, random caches) and returns its invoke."""
    runner = interp.get_signature_runner(name)
    interp._interpreter.AllocateTensors(runner._subgraph_index)
    vocab = interp.get_signature_runner("decode").get_output_details()["logits"]["shape"][-1]
    rng = np.random.default_rng(seed)
    for input_name, detail in runner.get_input_details().items():
        if input_name == "input_pos":
            value = np.array([position], np.int32)
        elif input_name == "tokens":
            value = rng.integers(0, vocab, detail["shape"]).astype(np.int32)
        else:
            value = rng.standard_normal(detail["shape"]).astype(np.float32)
        interp._interpreter.SetTensor(detail["index"], value, runner._subgraph_index)
    return lambda: interp._interpreter.Invoke(runner._subgraph_index)


def speed_model(path: Path, work: Path, threads: Sequence[int], runs: int) -> dict:
    """Per thread count and phase, tokens/s of LiteRT + XNNPACK and of ours (claim:all, default),
    timed in turns in one process (median of `runs`)."""
    from tflite_tools.bench import Contender
    from tflite_tools.fuse import fuse

    result = fuse(path, work / path.stem, cache_dir=CACHE)
    row: dict = {"model": path.stem, "phases": {}}
    for t in threads:
        contenders = {"xnnpack": Contender("xnnpack", str(path)).interpreter(t),
                      "all": Contender("all", str(result.model), delegate=str(result.library),
                                       claim="all").interpreter(t),
                      # options alone load the delegate under its default policy
                      "default": Contender("default", str(result.model), delegate=str(result.library),
                                           options=(("log_level", "error"),)).interpreter(t)}
        names = sorted(k for k in contenders["xnnpack"].get_signature_list() if k.startswith("prefill_"))
        phases = [(n, int(n.split("_")[1]), 0) for n in names] + [("decode", 1, p) for p in DECODE_POSITIONS]
        for signature, tokens, position in phases:
            invokes = {who: _signature_invoke(i, signature, position) for who, i in contenders.items()}
            times: dict[str, list[float]] = {who: [] for who in invokes}
            for who, invoke in invokes.items():
                invoke()  # warm
            for _ in range(runs):
                for who, invoke in invokes.items():
                    began = time.perf_counter()
                    invoke()
                    times[who].append(time.perf_counter() - began)
            phase = f"{signature}@{position}" if signature == "decode" else signature
            row["phases"][(phase, t)] = {who: tokens / statistics.median(s) for who, s in times.items()}
    return row


def speed_table(rows: list[dict], threads: Sequence[int]) -> str:
    """Markdown: per model and phase, XNNPACK's tokens/s and ours (claim:all, default) as speed-ups."""
    head = " | ".join(f"{t} thread{'s' if t > 1 else ''}: XNNPACK tok/s; ours all, default (speed-up)" for t in threads)
    lines = [f"| model | phase | {head} |", "|---|---|" + "---|" * len(threads)]
    for row in rows:
        for phase in dict.fromkeys(p for p, _ in row["phases"]):
            cells = []
            for t in threads:
                r = row["phases"][(phase, t)]
                cells.append(f"{r['xnnpack']:.1f}, {r['all'] / r['xnnpack']:.2f}x, {r['default'] / r['xnnpack']:.2f}x")
            lines.append(f"| {row['model']} | {phase} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """build, check or speed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "check", "speed"):
        p = sub.add_parser(name)
        p.add_argument("--folder", type=Path, default=FOLDER)
        p.add_argument("--only", nargs="*", default=[])
        if name == "speed":
            p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
            p.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.folder, args.only)
        return 0
    paths = [p for p in sorted(args.folder.glob("*.tflite")) if not args.only or p.stem in args.only]
    with tempfile.TemporaryDirectory(prefix="dnnfusion-decoders-") as tmp:
        if args.command == "speed":
            rows = [speed_model(p, Path(tmp), args.threads, args.runs) for p in paths]
            from tflite_tools.bench import host_line  # here: `build` runs in a venv without the project

            print(host_line() + "\n")  # x86 speed turns on its vector extension
            print(speed_table(rows, args.threads))
            return 0
        print(CHECK_HEAD)
        rows = []
        for path in paths:
            rows.append(check_model(path, Path(tmp)))
            print(check_line(rows[-1]), flush=True)
    return 0 if all(len(set(map(tuple, r["tokens"].values()))) == 1 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
