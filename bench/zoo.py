"""The model sets the benchmarks default to. The reference set: `../shared/models` when present (so
every figure is on the same bytes), else regenerated here with TensorFlow (`pip install -e '.[models]'`;
random weights, no download). Beside it, named sets of the project's own test models
(`models_from_tests`), for the figures that need what the reference set lacks (fp16 weights) or
that the reference set makes too slow to take (GPU traces under PoCL).

    python bench/zoo.py --out bench/zoo            # regenerate all seven with TensorFlow
    python bench/zoo.py --list                     # which files the benchmarks will use

The recipes follow ../shared/models/README.md: TensorFlow 2.21, `TFLiteConverter.from_keras_model`,
builtin ops only, batch 1. Regenerated files have the same structure as the shared ones but not the
same bytes (random weights, converter nondeterminism): figures from them are comparable with each
other, not with RESULTS.md's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "models"
NAMES = ["bert_small", "efficientnet_b0", "gpt2_small", "mobilenet_v2", "mobilenet_v2_int8", "mobilenet_v3_small",
         "unet_small"]
TEST_MODELS = REPO / "tests" / "models"
# Models stored with fp16 weights (the reference set has none): bench/sizes.py.
FP16_TEST_MODELS = ("mobilenet_v2_035_96_fp16", "transformer_encoder_fp16")
# Small models of the reference set's kinds (a U-Net, an encoder, a MobileNetV2 at 0.35 x 96) and
# single blocks: GPU traces under PoCL take minutes on them (bench/gpu_counts.py --quick), an hour
# on the reference set.
GPU_TEST_MODELS = ("unet_tiny", "transformer_encoder", "depthwise_residual", "fc_softmax", "mobilenet_v2_035_96",
                   "conv_fp16_weights")


def reference_models(regenerated: Path | None = None) -> list[Path]:
    """The shared models if all are present, else the regenerated ones in `regenerated`."""
    if all((SHARED / f"{n}.tflite").exists() for n in NAMES):
        return [SHARED / f"{n}.tflite" for n in NAMES]
    folder = regenerated or REPO / "bench" / "zoo"
    missing = [n for n in NAMES if not (folder / f"{n}.tflite").exists()]
    if missing:
        raise FileNotFoundError(f"no reference models: ../shared/models is absent and {folder} lacks {missing}; "
                                "run python bench/zoo.py (needs TensorFlow: pip install -e '.[models]')")
    return [folder / f"{n}.tflite" for n in NAMES]


def models_from_tests(names: Sequence[str]) -> list[Path]:
    """The project's test models of these names (tests/models/NAME.tflite, committed)."""
    paths = [TEST_MODELS / f"{n}.tflite" for n in names]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{TEST_MODELS} lacks {missing}")
    return paths


def build(out: Path) -> list[Path]:
    """Converts all seven models into `out` with TensorFlow."""
    import numpy as np
    import tensorflow as tf

    keras = tf.keras
    keras.utils.set_random_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def convert(name: str, model, **settings) -> None:
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        for key, value in settings.items():
            setattr(converter, key, value)
        path = out / f"{name}.tflite"
        path.write_bytes(converter.convert())
        written.append(path)
        print(f"wrote {path}", file=sys.stderr, flush=True)

    def image(size: int = 224):
        return keras.Input((size, size, 3), batch_size=1)

    mobilenet = keras.applications.MobileNetV2(input_tensor=image(), weights=None)
    convert("mobilenet_v2", mobilenet)

    def representative():
        rng = np.random.default_rng(0)
        for _ in range(64):
            yield [rng.uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)]

    int8 = tf.lite.TargetSpec()
    int8.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    convert("mobilenet_v2_int8", mobilenet, optimizations=[tf.lite.Optimize.DEFAULT],
            representative_dataset=representative, target_spec=int8, inference_input_type=tf.int8,
            inference_output_type=tf.int8)
    convert("mobilenet_v3_small", keras.applications.MobileNetV3Small(input_tensor=image(), weights=None))
    convert("efficientnet_b0", keras.applications.EfficientNetB0(input_tensor=image(), weights=None))

    # U-Net: 4 levels of 2x(conv3x3 no bias, BN, ReLU), 16/32/64/128 channels, 256 at the bottom.
    def double_conv(x, channels):
        for _ in range(2):
            x = keras.layers.Conv2D(channels, 3, padding="same", use_bias=False)(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.ReLU()(x)
        return x

    x = inputs = image(128)
    skips = []
    for channels in (16, 32, 64, 128):
        x = double_conv(x, channels)
        skips.append(x)
        x = keras.layers.MaxPooling2D()(x)
    x = double_conv(x, 256)
    for channels, skip in zip((128, 64, 32, 16), reversed(skips)):
        x = keras.layers.Conv2DTranspose(channels, 2, strides=2)(x)
        x = double_conv(keras.layers.Concatenate()([x, skip]), channels)
    convert("unet_small", keras.Model(inputs, keras.layers.Conv2D(2, 1, activation="sigmoid")(x)))

    def feed_forward(h):
        return keras.layers.Dense(256)(keras.layers.Dense(1024, activation="gelu")(h))

    # BERT-small: embeddings + learned positions, LayerNorm, 4 post-LN encoder blocks.
    tokens = keras.Input((128,), batch_size=1, dtype="int32", name="input_ids")
    h = keras.layers.Embedding(30522, 256)(tokens) + keras.layers.Embedding(128, 256)(tf.range(128)[tf.newaxis, :])
    h = keras.layers.LayerNormalization(epsilon=1e-12)(h)
    for _ in range(4):
        h = keras.layers.LayerNormalization(epsilon=1e-12)(h + keras.layers.MultiHeadAttention(4, 64)(h, h))
        h = keras.layers.LayerNormalization(epsilon=1e-12)(h + feed_forward(h))
    convert("bert_small", keras.Model(tokens, h))

    # GPT-2-small: float embeddings in, learned positions, 2 pre-LN causal blocks, final LayerNorm.
    embeddings = keras.Input((64, 256), batch_size=1, name="embeddings")
    h = embeddings + keras.layers.Embedding(64, 256)(tf.range(64)[tf.newaxis, :])
    for _ in range(2):
        n = keras.layers.LayerNormalization(epsilon=1e-5)(h)
        h = h + keras.layers.MultiHeadAttention(4, 64)(n, n, use_causal_mask=True)
        h = h + feed_forward(keras.layers.LayerNormalization(epsilon=1e-5)(h))
    convert("gpt2_small", keras.Model(embeddings, keras.layers.LayerNormalization(epsilon=1e-5)(h)))
    return written


def main(argv: list[str] | None = None) -> int:
    """Regenerates the set, or lists the files the benchmarks use."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "zoo")
    parser.add_argument("--list", action="store_true", help="print the model files the benchmarks use")
    args = parser.parse_args(argv)
    if args.list:
        for path in reference_models(args.out):
            print(path)
        return 0
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        print("zoo: TensorFlow is needed to regenerate the models: pip install -e '.[models]'", file=sys.stderr)
        return 2
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
