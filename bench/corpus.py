"""The converter corpus: architectures converted with TensorFlow (random weights, no downloads),
then fused and run with the delegate, per model: does it fuse, does it match, what is claimed,
what is declined and why.

    python bench/corpus.py build --out bench/corpus [--only NAME ...]    # needs TensorFlow
    python bench/corpus.py build --set real [--only NAME ...]           # bench/real_size.py, into bench/corpus-real
    python bench/corpus.py build-torch --out bench/corpus [--only NAME ...]  # needs litert-torch
    python bench/corpus.py check bench/corpus [--only NAME ...] [--write-results] [--set real]
    python bench/corpus.py speed bench/corpus [--only NAME ...] [--runs 30] [--threads 1 2]
    python bench/corpus.py memory bench/corpus [--only NAME ...]

`build` needs only TensorFlow and numpy (`pip install -e '.[models]'`, or any venv with
tensorflow-cpu: run this file with that venv's Python). `build-torch` converts PyTorch modules with
litert-torch (Google's converter for PyTorch users: its own NCHW-to-NHWC transposes, GELU and
LayerNorm patterns, PT2E int8), in a venv of its own: `python -m venv torchvenv && torchvenv/bin/pip
install litert-torch`, then run this file with that Python (PyPI's Linux torch wheel brings CUDA
libraries, about 6 GB; the CPU-only build lives on PyTorch's own index). `check` runs in the project's venv: for each
model that stock LiteRT + XNNPACK runs it fuses for the host, runs the fused model with the delegate
under claim:all and the default policy on seeded inputs, and compares with the kernels
`tflite_tools.run.reference_resolver` names. `--write-results` replaces the corpus table in
bench/RESULTS.md. `speed` times each model fused for the host against LiteRT + XNNPACK
(tflite_tools.bench: interleaved in one process at one thread, a process per contender at more),
our delegate claiming every block and the default policy, and prints a table of ratios with the
geometric mean over the models with float activations. `memory` measures each model's peak resident memory (a
fresh process per contender, through one invoke) with LiteRT + XNNPACK alone and with our delegate
under both policies. Models are cached in the output folder (not committed: bench/corpus/ is ignored), and
`check` and `speed` keep the kernels they compile in its kernels/ folder, so one compiles what the other times.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from real_size import REAL_SIZE  # beside this script

REPO = Path(__file__).resolve().parents[1]
KERNELS = "kernels"  # a corpus folder's kernel cache, shared by check and speed
sys.path.insert(0, str(REPO))

# name -> recipe(tf) returning (keras model, converter settings). Inputs are small (the corpus
# checks structure: every op pattern these architectures emit, not speed).
RECIPES: dict[str, Callable] = {}


def recipe(name: str, table: dict[str, Callable] | None = None):
    """Registers a corpus model under `name` (in RECIPES, or the table given)."""
    def add(fn: Callable) -> Callable:
        (RECIPES if table is None else table)[name] = fn
        return fn
    return add


def _image(tf, size: int, channels: int = 3):
    return tf.keras.Input((size, size, channels), batch_size=1)


def _application(builder: str, size: int, **kwargs):
    def make(tf):
        app = getattr(tf.keras.applications, builder)
        return app(input_tensor=_image(tf, size), weights=None, **kwargs), {}
    return make


for _name, _builder, _size, _kwargs in [
    ("resnet50v2", "ResNet50V2", 64, {}),
    ("inception_v3", "InceptionV3", 75, {}),
    ("densenet121", "DenseNet121", 64, {}),
    ("xception", "Xception", 71, {}),
    ("nasnet_mobile", "NASNetMobile", 64, {"include_top": False, "pooling": "avg"}),
    ("mobilenet_v3_large", "MobileNetV3Large", 64, {}),
    ("efficientnet_v2_b0", "EfficientNetV2B0", 64, {}),
    ("convnext_tiny", "ConvNeXtTiny", 64, {}),
    ("mobilenet_v1", "MobileNet", 64, {}),
    ("mobilenet_v2_128", "MobileNetV2", 128, {}),
]:
    recipe(_name)(_application(_builder, _size, **_kwargs))


@recipe("blazeface_like")
def _blazeface(tf):
    """BlazeFace-style: PRELU, 5x5 depthwise residual blocks, channel-padding for the skip."""
    layers = tf.keras.layers
    x = inputs = _image(tf, 64)
    x = layers.PReLU(shared_axes=[1, 2])(layers.Conv2D(16, 5, strides=2, padding="same")(x))
    for channels, stride in [(16, 1), (24, 1), (32, 2), (32, 1)]:
        y = layers.DepthwiseConv2D(5, strides=stride, padding="same")(x)
        y = layers.Conv2D(channels, 1)(y)
        skip = layers.MaxPooling2D(2)(x) if stride == 2 else x
        extra = channels - skip.shape[-1]
        if extra:
            skip = tf.keras.ops.pad(skip, [[0, 0], [0, 0], [0, 0], [0, extra]])
        x = layers.PReLU(shared_axes=[1, 2])(layers.Add()([y, skip]))
    boxes = layers.Reshape((-1, 16))(layers.Conv2D(32, 1)(x))
    return tf.keras.Model(inputs, boxes), {}


@recipe("deeplab_like")
def _deeplab(tf):
    """DeepLab-style: dilated convs (an ASPP head) and a bilinear resize back to the input."""
    layers = tf.keras.layers
    x = inputs = _image(tf, 64)
    x = layers.Conv2D(32, 3, strides=4, padding="same", activation="relu")(x)
    branches = [layers.Conv2D(16, 1, activation="relu")(x)]
    branches += [layers.Conv2D(16, 3, padding="same", dilation_rate=r, activation="relu")(x) for r in (2, 4)]
    x = layers.Conv2D(8, 1)(layers.Concatenate()(branches))
    x = layers.Resizing(64, 64, interpolation="bilinear")(x)
    return tf.keras.Model(inputs, layers.Softmax()(x)), {}


@recipe("unet_transpose")
def _unet(tf):
    """A two-level U-Net with TRANSPOSE_CONV upsampling and concatenated skips."""
    layers = tf.keras.layers
    x = inputs = _image(tf, 64)
    skips = []
    for channels in (16, 32):
        x = layers.Conv2D(channels, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    for channels, skip in zip((32, 16), reversed(skips)):
        x = layers.Conv2DTranspose(channels, 2, strides=2)(x)
        x = layers.Conv2D(channels, 3, padding="same", activation="relu")(layers.Concatenate()([x, skip]))
    return tf.keras.Model(inputs, layers.Conv2D(2, 1, activation="sigmoid")(x)), {}


def _transformer(tf, h, causal: bool, blocks: int = 2, heads: int = 4):
    """Learned positions added to `h` [1, length, width], then pre-LN encoder blocks (MultiHeadAttention,
    a GELU feed-forward)."""
    layers = tf.keras.layers
    length, width = h.shape[1], h.shape[2]
    h = h + layers.Embedding(length, width)(tf.range(length)[tf.newaxis, :])
    for _ in range(blocks):
        n = layers.LayerNormalization(epsilon=1e-6)(h)
        h = h + layers.MultiHeadAttention(heads, width // heads)(n, n, use_causal_mask=causal)
        n = layers.LayerNormalization(epsilon=1e-6)(h)
        h = h + layers.Dense(width)(layers.Dense(2 * width, activation="gelu")(n))
    return h


@recipe("vit_tiny")
def _vit(tf):
    """ViT-tiny-style: 8x8 patches as a strided conv, learned positions, 2 pre-LN blocks."""
    layers = tf.keras.layers
    inputs = _image(tf, 32)
    h = _transformer(tf, layers.Reshape((16, 64))(layers.Conv2D(64, 8, strides=8)(inputs)), causal=False)
    return tf.keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling1D()(h))), {}


@recipe("causal_decoder")
def _decoder(tf):
    """A causal transformer decoder over token ids (GATHER embedding, masked attention)."""
    layers = tf.keras.layers
    tokens = tf.keras.Input((32,), batch_size=1, dtype="int32")
    h = _transformer(tf, layers.Embedding(500, 64)(tokens), causal=True)
    return tf.keras.Model(tokens, layers.Dense(500)(layers.LayerNormalization()(h))), {}


@recipe("speech_conv1d")
def _speech(tf):
    """A 1-D conv speech model: Conv1D stacks over 100 frames of 40 features, pooling, a classifier."""
    layers = tf.keras.layers
    x = inputs = tf.keras.Input((100, 40), batch_size=1)
    for channels in (64, 64, 96):
        x = layers.Conv1D(channels, 5, padding="same", activation="relu")(x)
        x = layers.MaxPooling1D(2)(x)
    return tf.keras.Model(inputs, layers.Dense(12, activation="softmax")(layers.GlobalAveragePooling1D()(x))), {}


@recipe("cnn_fp16_weights")
def _fp16(tf):
    """A small CNN with fp16 weights (DEQUANTIZE in front of every conv)."""
    layers = tf.keras.layers
    x = inputs = _image(tf, 32)
    for channels in (16, 32):
        x = layers.Conv2D(channels, 3, padding="same", activation="relu")(x)
        x = layers.DepthwiseConv2D(3, padding="same", activation="relu")(x)
    spec = tf.lite.TargetSpec()
    spec.supported_types = [tf.float16]
    return tf.keras.Model(inputs, x), {"optimizations": [tf.lite.Optimize.DEFAULT], "target_spec": spec}


@recipe("cnn_sparse_weights")
def _sparse(tf):
    """A small CNN whose conv weights are 90% zeros, converted with the sparsity optimization."""
    import numpy as np

    layers = tf.keras.layers
    x = inputs = _image(tf, 32)
    convs = [layers.Conv2D(c, 3, padding="same", activation="relu") for c in (32, 32)]
    for conv in convs:
        x = conv(x)
    model = tf.keras.Model(inputs, x)
    rng = np.random.default_rng(0)
    for conv in convs:
        w, b = conv.get_weights()
        conv.set_weights([w * (rng.random(w.shape) < 0.1), b])
    return model, {"optimizations": [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]}


def _int8(base: str):
    """The full-integer (int8 in and out) variant of a float recipe."""
    def make(tf):
        import numpy as np

        model, _ = RECIPES[base](tf)
        shapes = [tuple(d or 1 for d in t.shape) for t in model.inputs]

        def representative():
            rng = np.random.default_rng(0)
            for _ in range(16):
                yield [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]

        spec = tf.lite.TargetSpec()
        spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        return model, {"optimizations": [tf.lite.Optimize.DEFAULT], "representative_dataset": representative,
                       "target_spec": spec, "inference_input_type": tf.int8, "inference_output_type": tf.int8}
    return make


for _base in ("mobilenet_v2_128", "unet_transpose", "vit_tiny"):
    recipe(f"{_base}_int8")(_int8(_base))


def _open_batch(base: str):
    """A float recipe with its batch dimension left open (Keras's default: shape signature -1), as
    most Keras models convert: fused at the converter's static batch of 1."""
    def make(tf):
        model, settings = RECIPES[base](tf)
        inputs = [tf.keras.Input(t.shape[1:], dtype=t.dtype) for t in model.inputs]
        clone = tf.keras.models.clone_model(model, input_tensors=tf.nest.pack_sequence_as(model.input, inputs))
        clone.set_weights(model.get_weights())
        return clone, settings
    return make


for _base in ("mobilenet_v2_128", "vit_tiny"):
    recipe(f"{_base}_open_batch")(_open_batch(_base))


# name -> recipe(torch) returning (module in eval mode, sample input tuple, int8: bool). PyTorch
# models, converted by litert-torch.
TORCH_RECIPES: dict[str, Callable] = {}


def _torch_cnn(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                                      nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))

        def forward(self, x):
            return torch.relu(x + self.body(x))

    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(), Block(16),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), Block(32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


@recipe("torch_resnet_like", TORCH_RECIPES)
def _torch_resnet(torch):
    """Residual blocks with batch norm, NCHW as PyTorch writes it."""
    return _torch_cnn(torch).eval(), (torch.randn(1, 3, 64, 64),), False


@recipe("torch_mobilenet_like", TORCH_RECIPES)
def _torch_mobilenet(torch):
    """Depthwise-separable blocks, Hardswish, a squeeze-and-excitation gate."""
    nn = torch.nn

    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.fc = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c // 4, 1), nn.ReLU(),
                                    nn.Conv2d(c // 4, c, 1), nn.Hardsigmoid())

        def forward(self, x):
            return x * self.fc(x)

    def dw(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin), nn.BatchNorm2d(cin), nn.Hardswish(),
                             SE(cin), nn.Conv2d(cin, cout, 1), nn.BatchNorm2d(cout))

    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.Hardswish(), dw(16, 24, 2), dw(24, 24, 1), dw(24, 40, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(40, 10))
    return model.eval(), (torch.randn(1, 3, 64, 64),), False


@recipe("torch_vit_like", TORCH_RECIPES)
def _torch_vit(torch):
    """Patch embedding and nn.TransformerEncoder layers (GELU, LayerNorm, multi-head attention)."""
    nn = torch.nn

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 64, 8, stride=8)
            layer = nn.TransformerEncoderLayer(64, 4, 128, activation="gelu", batch_first=True, dropout=0.0)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(64)
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            tokens = self.patch(x).flatten(2).transpose(1, 2)
            return self.head(self.norm(self.encoder(tokens)).mean(dim=1))

    return ViT().eval(), (torch.randn(1, 3, 64, 64),), False


@recipe("torch_resnet_like_int8", TORCH_RECIPES)
def _torch_resnet_int8(torch):
    """The residual CNN quantized with PT2E (static int8 activations, per-channel weights)."""
    return _torch_cnn(torch).eval(), (torch.randn(1, 3, 64, 64),), True


# set -> (recipes, default folder, its RESULTS section's heading)
SETS = {"small": (RECIPES, REPO / "bench" / "corpus", "## Converter corpus"),
        "real": (REAL_SIZE, REPO / "bench" / "corpus-real", "## Real-size corpus")}


def build_torch(out: Path, only: list[str]) -> None:
    """Converts the PyTorch recipes with litert-torch into `out` (skipping files already there)."""
    import litert_torch
    import torch

    def convert(name: str, path: Path) -> None:
        torch.manual_seed(0)
        module, sample, int8 = TORCH_RECIPES[name](torch)
        if int8:
            module = _pt2e_int8(torch, module, sample)
        litert_torch.convert(module, sample).export(str(path))

    _convert_each(out, only or list(TORCH_RECIPES), convert)


def _convert_each(out: Path, names: list[str], convert: Callable[[str, Path], None]) -> None:
    """convert(name, path) for every recipe whose file is not in `out` yet; one recipe the
    converter refuses is reported and does not stop the others."""
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = out / f"{name}.tflite"
        if path.exists():
            continue
        try:
            convert(name, path)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            print(f"corpus: {name}: {type(exc).__name__}: {first}", file=sys.stderr, flush=True)
            continue
        print(f"wrote {path}", file=sys.stderr, flush=True)


def _pt2e_int8(torch, module, sample):
    """litert-torch's PT2E recipe: export, prepare with its quantizer, calibrate, convert."""
    from litert_torch.quantize import pt2e_quantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = pt2e_quantizer.PT2EQuantizer().set_global(
        pt2e_quantizer.get_symmetric_quantization_config(is_per_channel=True))
    exported = torch.export.export(module, sample).module()
    prepared = prepare_pt2e(exported, quantizer)
    for _ in range(8):
        prepared(*[torch.randn_like(t) for t in sample])
    return convert_pt2e(prepared, fold_quantize=False)


def build(out: Path, only: list[str], recipes: dict[str, Callable]) -> None:
    """Converts the recipes into `out` (skipping files already there)."""
    import tensorflow as tf

    def convert(name: str, path: Path) -> None:
        tf.keras.utils.set_random_seed(0)
        model, settings = recipes[name](tf)
        with tempfile.TemporaryDirectory(prefix="dnnfusion-corpus-") as tmp:
            converter = tf.lite.TFLiteConverter.from_saved_model(_saved_model(tf, model, Path(tmp) / "saved"))
            for key, value in settings.items():
                setattr(converter, key, value)
            path.write_bytes(converter.convert())

    _convert_each(out, only or list(recipes), convert)


def _saved_model(tf, model, folder: Path) -> str:
    """Exports the Keras model as a SavedModel at its inputs' fixed shapes (batch included), the
    route Keras 3 documents for TFLite: keras-hub's models do not convert through from_keras_model."""
    signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype, name=t.name), model.input)
    model.export(str(folder), format="tf_saved_model", verbose=False, input_signature=[signature])
    return str(folder)


def fuse_for_row(path: Path, work: Path, row: dict, cache: Path | None = None):
    """Fuses `path` for the host into `work` for a corpus row (kernels cached in `cache`, else in
    `work`): the FuseResult, with row["seconds"] set, or None with row["note"] saying why fuse
    refused it."""
    from tflite_tools.fuse import fuse
    from tflite_tools.model.errors import ModelError

    start = time.perf_counter()
    try:
        result = fuse(path, work / path.stem, cache_dir=cache or work / "cache")
    except ModelError as exc:
        row["note"] = f"fuse refused it: {exc}"
        return None
    row["seconds"] = round(time.perf_counter() - start, 1)
    return result


def check_model(path: Path, work: Path, cache: Path | None = None) -> dict:
    """One corpus row: fuse (kernels cached in `cache`, else in `work`), run with the delegate
    (claim:all and default), compare."""
    from tflite_tools import runtime
    from tflite_tools.model.errors import ModelError
    from tflite_tools.run import run

    row = {"model": path.stem, "ops": None, "fused": False, "matches": {}, "claimed": None, "declined": [],
           "note": ""}
    try:
        runtime.run(stock := runtime.make_interpreter(path, "xnnpack"), runtime.random_inputs(stock))
    except (RuntimeError, ValueError) as exc:
        row["note"] = f"stock LiteRT cannot run it: {str(exc).splitlines()[0]}"
        return row
    result = fuse_for_row(path, work, row, cache)
    if result is None:
        return row
    row["fused"] = True
    row["ops"] = sum(len(k.nodes) for k in result.kernels) + result.decoders  # the delegate runs the decoders too
    row["blocks_without_kernel"] = sorted({k.skipped for k in result.kernels if not k.kernel})
    for claim in ("all", None):
        try:
            outcome = run(result.model, result.library, options={"claim": claim} if claim else {})
        except ModelError as exc:
            row["matches"][claim or "default"] = False
            row["note"] = str(exc)
            continue
        row["matches"][claim or "default"] = outcome.ok
        if claim == "all":
            row["claimed"] = len(outcome.claims["claimed_nodes"])
            row["declined"] = [f"{d['block']}: {d['reason']}" for d in outcome.claims["declined"]]
            row["reference"] = outcome.reference
    return row


def speed_model(path: Path, work: Path, threads: Sequence[int], runs: int, cache: Path | None = None) -> dict:
    """One speed row: per thread count, XNNPACK's median ms and our two policies' ratios to it
    (kernels cached in `cache`, else in `work`)."""
    from tflite_tools.bench import benchmark, ratios
    from tflite_tools.fuse import fuse
    from tflite_tools.model.errors import ModelError

    row = {"model": path.stem, "int8": "int8" in path.stem, "times": {}, "note": ""}
    try:
        result = fuse(path, work / path.stem, cache_dir=cache or work / "cache")
        for t in threads:
            timings = benchmark(str(result.model), str(result.library), threads=t, runs=runs)
            base = next(x for x in timings if x.name == "xnnpack").median / 1000
            r = ratios(timings)
            row["times"][t] = (base, r["dnnfusion-all"], r["dnnfusion-profitable"])
    except ModelError as exc:
        row["note"] = str(exc)
    return row


def speed_line(row: dict, threads: Sequence[int]) -> str:
    """One model's row of the speed table."""
    cells = [f"{row['times'][t][0]:.2f}, {row['times'][t][1]:.2f}x, {row['times'][t][2]:.2f}x" if t in row["times"]
             else row["note"] or "-" for t in threads]
    return f"| {row['model']} | {' | '.join(cells)} |"


def speed_table(rows: list[dict], threads: Sequence[int]) -> str:
    """The Markdown table of speed rows, with the geometric means of the models whose activations are
    float (dynamic-range ones among them; int8 models are not averaged in)."""
    head = " | ".join(f"{t} thread{'s' if t > 1 else ''}: XNNPACK ms, ours all, ours default" for t in threads)
    lines = [f"| model | {head} |", "|---|" + "---|" * len(threads)] + [speed_line(r, threads) for r in rows]
    floats = [r for r in rows if not r["int8"] and len(r["times"]) == len(threads)]
    if floats:
        means = []
        for t in threads:
            all_, default = (math.exp(statistics.fmean(math.log(r["times"][t][k]) for r in floats)) for k in (1, 2))
            means.append(f"-, {all_:.2f}x, {default:.2f}x")
        lines.append(f"| geo-mean of {len(floats)} models with float activations | {' | '.join(means)} |")
    return "\n".join(lines)


def memory_model(path: Path, work: Path) -> dict:
    """One memory row: the peak resident memory (MiB) of LiteRT + XNNPACK and of our delegate
    claiming every block and under its default policy, each in a fresh process through one invoke."""
    from tflite_tools.bench import Timings, measure_peak_memory
    from tflite_tools.fuse import fuse
    from tflite_tools.model.errors import ModelError

    row = {"model": path.stem, "file_mib": path.stat().st_size / 2**20, "peak_mib": {}, "note": ""}
    try:
        result = fuse(path, work / path.stem)  # the user's kernel cache: the kernels, not their compile, matter here
        timings = [Timings(name, 0.0, 0.0) for name in ("xnnpack", "dnnfusion-all", "dnnfusion-profitable")]
        measure_peak_memory(timings, str(result.model), str(result.library), threads=1)
        row["peak_mib"] = {t.name: t.peak_memory_kib / 1024 for t in timings}
    except ModelError as exc:
        row["note"] = str(exc)
    return row


def memory_line(row: dict) -> str:
    """One model's row of the memory table."""
    peak = row["peak_mib"]
    if not peak:
        return f"| {row['model']} | {row['file_mib']:.0f} | {row['note'] or '-'} | | | |"
    base = peak["xnnpack"]
    return (f"| {row['model']} | {row['file_mib']:.0f} | {base:.0f} | {peak['dnnfusion-all']:.0f} | "
            f"{peak['dnnfusion-profitable']:.0f} | {peak['dnnfusion-profitable'] / base:.2f}x |")


MEMORY_HEADER = ("| model | file MiB | peak MiB: XNNPACK | ours all | ours default | ours default / XNNPACK |\n"
                 "|---|---|---|---|---|---|")


def _summary(reasons: list[str]) -> str:
    """Reasons for a table cell: the block and tensor names left out, each kind once with its count
    (a real-size model declines dozens of blocks for one reason)."""
    def kind(reason: str) -> str:
        reason = re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'...'", re.sub(r"^block_\d+: ", "", reason)))
        return re.sub(r"(node N \(builtin code N\)(, )?)+", "nodes ", reason)

    kinds = collections.Counter(kind(r) for r in reasons)
    return "; ".join(f"{n} x {kind}" if n > 1 else kind for kind, n in kinds.items()) or "-"


TABLE_HEADER = ("| model | fused | matches (claim:all / default) | nodes claimed (claim:all) / in blocks and their "
                "weights' decoders | declined, and blocks without a kernel | note |")


def table(rows: list[dict]) -> str:
    """The Markdown table of check results."""
    lines = [TABLE_HEADER, "|---|---|---|---|---|---|"]
    for r in rows:
        match = " / ".join({True: "yes", False: "NO"}[r["matches"].get(k)] if k in r["matches"] else "-"
                           for k in ("all", "default"))
        why = _summary(r["declined"] + [f"no kernel: {s}" for s in r.get("blocks_without_kernel", [])])
        lines.append(f"| {r['model']} | {'yes' if r['fused'] else 'no'} | {match} | {r['claimed']} / {r['ops']} | "
                     f"{why} | {r['note']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """build, check, speed or memory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--set", choices=sorted(SETS), default="small")
    b.add_argument("--out", type=Path)
    b.add_argument("--only", nargs="*", default=[], choices=sorted(RECIPES) + sorted(REAL_SIZE))
    t = sub.add_parser("build-torch")
    t.add_argument("--out", type=Path, default=REPO / "bench" / "corpus")
    t.add_argument("--only", nargs="*", default=[], choices=sorted(TORCH_RECIPES))
    c = sub.add_parser("check")
    c.add_argument("folder", type=Path, nargs="?", default=REPO / "bench" / "corpus")
    c.add_argument("--only", nargs="*", default=[])
    c.add_argument("--write-results", action="store_true")
    c.add_argument("--set", choices=sorted(SETS), default="small", help="whose section of RESULTS to write")
    v = sub.add_parser("speed")
    v.add_argument("folder", type=Path, nargs="?", default=REPO / "bench" / "corpus")
    v.add_argument("--only", nargs="*", default=[])
    v.add_argument("--runs", type=int, default=30)
    v.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    m = sub.add_parser("memory")
    m.add_argument("folder", type=Path, nargs="?", default=REPO / "bench" / "corpus")
    m.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args(argv)
    if args.command == "build":
        recipes, folder, _ = SETS[args.set]
        unknown = set(args.only) - set(recipes)
        if unknown:
            parser.error(f"not in the {args.set} set: {', '.join(sorted(unknown))}")
        build(args.out or folder, args.only, recipes)
        return 0
    if args.command == "build-torch":
        build_torch(args.out, args.only)
        return 0
    paths = [p for p in sorted(args.folder.glob("*.tflite")) if not args.only or p.stem in args.only]
    if args.command == "speed":
        with tempfile.TemporaryDirectory(prefix="dnnfusion-corpus-") as tmp:
            rows = []
            for path in paths:
                rows.append(speed_model(path, Path(tmp), args.threads, args.runs, args.folder / KERNELS))
                print(speed_line(rows[-1], args.threads), flush=True)
        from tflite_tools.bench import host_line  # here: `build` runs in a venv without the project

        print(host_line() + "\n")  # x86 speed turns on its vector extension
        print(speed_table(rows, args.threads))
        return 0
    if args.command == "memory":
        print(MEMORY_HEADER, flush=True)
        with tempfile.TemporaryDirectory(prefix="dnnfusion-corpus-") as tmp:
            for path in paths:
                print(memory_line(memory_model(path, Path(tmp))), flush=True)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="dnnfusion-corpus-") as tmp:
        for path in paths:
            rows.append(check_model(path, Path(tmp), args.folder / KERNELS))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.write_results:
        write_results(table(rows), args.set)
    return 0 if all(all(r["matches"].values()) for r in rows if r["fused"]) else 1


RESULTS = REPO / "bench" / "RESULTS.md"


def write_results(text: str, which: str) -> None:
    """Writes the set's corpus section of bench/RESULTS.md (appended when missing): the rows of
    `text` (a `table`) replace those of the same models, the others stay as they were."""
    _, folder, heading = SETS[which]
    body = RESULTS.read_text()
    start = body.find(heading + "\n")
    end = body.find("\n## ", start + len(heading)) if start >= 0 else -1
    old = body[start:end if end >= 0 else len(body)] if start >= 0 else ""
    rows = {line.split("|")[1].strip(): line for line in old.splitlines()
            if line.startswith("| ") and not line.startswith("| model |")}
    lines = text.splitlines()
    rows.update({line.split("|")[1].strip(): line for line in lines[2:]})
    flag = "" if which == "small" else f" --set {which}"
    section = (f"{heading}\n\n`python bench/corpus.py build{flag}` (TensorFlow 2.21, its own venv), then `python "
               f"bench/corpus.py check {folder.relative_to(REPO)}{flag} --write-results`, last on {datetime.date.today()}"
               f" (a model not in that check keeps the row of its own last one): fused for the host, run with the "
               f"delegate under claim:all and the default policy, compared with the kernels "
               f"`tflite_tools.run.reference_resolver` names.\n\n"
               + "\n".join([*lines[:2], *(rows[m] for m in sorted(rows))]) + "\n")
    if start >= 0:
        body = body[:start] + section + ("\n" + body[end + 1:] if end >= 0 else "")
    else:
        body = body.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(body)


if __name__ == "__main__":
    sys.exit(main())
