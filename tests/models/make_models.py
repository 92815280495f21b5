"""Regenerates the project's own test models in this folder.

    python tests/models/make_models.py builder      # ModelBuilder-made models (needs only the package)
    python tests/models/make_models.py tensorflow   # real converter output (pip install '.[models]')
    python tests/models/make_models.py tensorflow --only transformer_encoder_fp16   # just that one

Builder models are deterministic: the test suite regenerates them and checks the committed bytes.
Converter models use fixed seeds but depend on the TensorFlow version (2.21.0 made the committed
ones); they are small versions of the reference models in `../shared/models`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------------------------
# Builder-made models: one or a few ops each, named after what they exercise.


def _builder_models() -> dict[str, Callable[[], object]]:
    from tflite_tools.model.builder import ModelBuilder, quantization

    rng = np.random.default_rng(1234)

    def weights(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.5

    def add_relu():
        b = ModelBuilder()
        x, y = b.input("x", [1, 4, 4, 3]), b.input("y", [1, 4, 4, 3])
        b.output(b.op("ADD", [x, y], [1, 4, 4, 3], fused_activation_function="RELU"))
        return b.build()

    def conv_relu6():
        b = ModelBuilder()
        x = b.input("x", [1, 9, 7, 3])
        w, bias = b.const("w", weights(5, 3, 3, 3)), b.const("b", weights(5))
        y = b.op("CONV_2D", [x, w, bias], [1, 5, 4, 5], padding="SAME", stride_h=2, stride_w=2,
                 fused_activation_function="RELU6")
        b.output(y)
        return b.build()

    def depthwise_residual():
        b = ModelBuilder()
        x = b.input("x", [1, 6, 6, 7])
        w, bias = b.const("w", weights(1, 3, 3, 7)), b.const("b", weights(7))
        d = b.op("DEPTHWISE_CONV_2D", [x, w, bias], [1, 6, 6, 7], padding="SAME", stride_h=1, stride_w=1,
                 depth_multiplier=1, fused_activation_function="RELU6")
        b.output(b.op("ADD", [d, x], [1, 6, 6, 7]))
        return b.build()

    def fc_softmax():
        b = ModelBuilder()
        x = b.input("x", [2, 17])
        h = b.op("FULLY_CONNECTED", [x, b.const("w", weights(10, 17)), b.const("b", weights(10))], [2, 10])
        b.output(b.op("SOFTMAX", [h], [2, 10], beta=1.0))
        return b.build()

    def fc_no_bias():
        # The bias is an omitted optional input: index -1 in the file.
        b = ModelBuilder()
        x = b.input("x", [3, 8])
        b.output(b.op("FULLY_CONNECTED", [x, b.const("w", weights(4, 8)), None], [3, 4]))
        return b.build()

    def swish_chain():
        b = ModelBuilder()
        x = b.input("x", [1, 5, 5, 8])
        s = b.op("MUL", [x, b.const("scale", weights(8))], [1, 5, 5, 8])
        t = b.op("ADD", [s, b.const("shift", weights(8))], [1, 5, 5, 8])
        g = b.op("LOGISTIC", [t], [1, 5, 5, 8])
        b.output(b.op("MUL", [t, g], [1, 5, 5, 8]))
        return b.build()

    def reshape_transpose():
        b = ModelBuilder()
        x = b.input("x", [1, 6, 8])
        r = b.op("RESHAPE", [x, b.const("shape", [1, 6, 2, 4])], [1, 6, 2, 4], new_shape=[1, 6, 2, 4])
        t = b.op("TRANSPOSE", [r, b.const("perm", [0, 2, 1, 3])], [1, 2, 6, 4])
        b.output(t)
        return b.build()

    def split_outputs():
        b = ModelBuilder()
        x = b.input("x", [1, 4, 6])
        lo, hi = b.op("SPLIT", [b.const("axis", np.array(2, np.int32)), x], [[1, 4, 3], [1, 4, 3]], num_splits=2)
        b.output(b.op("TANH", [lo], [1, 4, 3]), hi)
        return b.build()

    def int8_add():
        b = ModelBuilder()
        qa, qb, qo = quantization(0.05, -3), quantization(0.02, 5), quantization(0.08, -10)
        x = b.input("x", [1, 8, 3], "int8", quant=qa)
        y = b.input("y", [1, 8, 3], "int8", quant=qb)
        b.output(b.op("ADD", [x, y], [1, 8, 3], quant=qo))
        return b.build()

    def dynamic_batch():
        b = ModelBuilder()
        x = b.input("x", [1, 4], shape_signature=[-1, 4])
        y = b.op("ADD", [x, b.const("bias", weights(4))], [1, 4])
        y.shape_signature = (-1, 4)
        b.output(y)
        return b.build()

    def run_time_shape():
        # A tensor LiteRT sizes only as the model runs (a TILE by an input's multiples) beside a
        # block that has static shapes: the delegate must load and claim the block.
        b = ModelBuilder()
        x = b.input("x", [1, 4, 4, 3])
        v = b.input("v", [2])
        n = b.input("n", [1], "int32")
        y = b.op("RELU", [b.op("ADD", [x, b.const("bias", weights(3))], [1, 4, 4, 3])], [1, 4, 4, 3])
        tiled = b.op("TILE", [v, n], [2])
        tiled.shape_signature = (-1,)
        b.output(y, tiled)
        return b.build()

    def int4_mlp():
        # A decoder's MLP with int4 weights, as current LLM converters write them (dynamic range: float
        # activations, each row quantized as the kernel runs): per-channel up projection with
        # asymmetric inputs and a fused RELU, per-tensor down projection with symmetric ones, an odd
        # element count (the last byte half used), a residual ADD.
        own = np.random.default_rng(44)
        b = ModelBuilder()
        x = b.input("x", [1, 6, 32])
        up = b.const("up", own.integers(-8, 8, (45, 32)), "int4",
                     quant=quantization(own.uniform(0.01, 0.05, 45), 0, axis=0))
        h = b.op("FULLY_CONNECTED", [x, up, b.const("up_bias", own.standard_normal(45).astype(np.float32))],
                 [1, 6, 45], keep_num_dims=True, asymmetric_quantize_inputs=True, fused_activation_function="RELU")
        down = b.const("down", own.integers(-8, 8, (32, 45)), "int4", quant=quantization(0.03, 0))
        y = b.op("FULLY_CONNECTED", [h, down, None], [1, 6, 32], keep_num_dims=True)
        b.output(b.op("ADD", [x, y], [1, 6, 32]))
        return b.build()

    def int4_blockwise_mlp():
        # The same MLP with weights quantized per block of 32 input channels (ai-edge-quantizer's
        # blockwise int4 recipe): each block's scales, in half precision, are a constant of their
        # own that only the weights' quantization names and no operator reads. The scales are
        # bfloat16 values, as the quantizer writes them (XNNPACK keeps block scales in bfloat16).
        own = np.random.default_rng(45)

        def scales(*shape):
            return (own.uniform(0.01, 0.05, shape).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)

        b = ModelBuilder()
        x = b.input("x", [1, 6, 64])
        up = b.blockwise_const("up", own.integers(-8, 8, (96, 64)), scales(96, 2), 32)
        h = b.op("FULLY_CONNECTED", [x, up, b.const("up_bias", own.standard_normal(96).astype(np.float32))],
                 [1, 6, 96], keep_num_dims=True, fused_activation_function="RELU")
        down = b.blockwise_const("down", own.integers(-8, 8, (64, 96)), scales(64, 3), 32)
        y = b.op("FULLY_CONNECTED", [h, down, None], [1, 6, 64], keep_num_dims=True)
        b.output(b.op("ADD", [x, y], [1, 6, 64]))
        return b.build()

    def zero_size():
        # A tensor of no elements: LiteRT runs the model; no kernel is built for it.
        b = ModelBuilder()
        x = b.input("x", [1, 0, 4, 3])
        b.output(b.op("RELU", [b.op("ADD", [x, b.const("bias", weights(3))], [1, 0, 4, 3])], [1, 0, 4, 3]))
        return b.build()

    def segment_embeddings():
        # Token and segment ids as a BERT takes them: the segment table has 2 rows, so random ids
        # must stay under 2 for the model to run at all. The segment ids reach it as Keras 3's
        # Embedding passes them, negative ones wrapped: SELECT_V2(ids < 0, ids + 2, ids).
        b = ModelBuilder()
        ids = b.input("ids", [1, 8], "int32")
        given = b.input("segments", [1, 8], "int32")
        negative = b.op("LESS", [given, b.const("zero", np.array(0, np.int32))], [1, 8], dtype="bool")
        wrapped = b.op("ADD", [given, b.const("rows", np.array(2, np.int32))], [1, 8], dtype="int32")
        segments = b.op("SELECT_V2", [negative, wrapped, given], [1, 8], dtype="int32")
        tokens = b.op("GATHER", [b.const("token_table", weights(30, 4)), ids], [1, 8, 4], dtype="float32", axis=0)
        kinds = b.op("GATHER", [b.const("segment_table", weights(2, 4)), segments], [1, 8, 4], dtype="float32", axis=0)
        b.output(b.op("TANH", [b.op("ADD", [tokens, kinds], [1, 8, 4])], [1, 8, 4]))
        return b.build()

    def video_cnn():
        # C3D's layers: 3x3x3 convolutions over [frames, height, width, channels], each followed by
        # a RELU op of its own (as Keras' Conv3D + ReLU convert), the second strided; then a 3-D
        # U-Net's upsampling (a strided CONV_3D_TRANSPOSE, and its RELU).
        b = ModelBuilder()
        x = b.input("x", [1, 4, 8, 8, 3])
        y = b.op("CONV_3D", [x, b.const("w1", weights(3, 3, 3, 3, 8)), b.const("b1", weights(8))], [1, 4, 8, 8, 8],
                 padding="SAME", stride_d=1, stride_h=1, stride_w=1)
        y = b.op("RELU", [y], [1, 4, 8, 8, 8])
        y = b.op("CONV_3D", [y, b.const("w2", weights(3, 3, 3, 8, 16)), b.const("b2", weights(16))], [1, 2, 4, 4, 16],
                 padding="SAME", stride_d=2, stride_h=2, stride_w=2)
        y = b.op("RELU", [y], [1, 2, 4, 4, 16])
        y = b.op("CONV_3D_TRANSPOSE", [b.const("up_shape", np.array([1, 4, 8, 8, 8], np.int32)),
                                       b.const("w3", weights(2, 2, 2, 8, 16)), y, b.const("b3", weights(8))],
                 [1, 4, 8, 8, 8], dtype="float32", padding="SAME", stride_d=2, stride_h=2, stride_w=2)
        b.output(b.op("RELU", [y], [1, 4, 8, 8, 8]))
        return b.build()

    def custom_op():
        b = ModelBuilder()
        x = b.input("x", [1, 4])
        c = b.custom("DnnfTestCustom", [x], [1, 4], custom_options=b"\x01\x02opaque")
        b.output(b.op("RELU", [c], [1, 4]))
        return b.build()

    return {
        "add_relu": add_relu,
        "conv_relu6": conv_relu6,
        "depthwise_residual": depthwise_residual,
        "fc_softmax": fc_softmax,
        "fc_no_bias": fc_no_bias,
        "swish_chain": swish_chain,
        "reshape_transpose": reshape_transpose,
        "split_outputs": split_outputs,
        "int8_add": int8_add,
        "dynamic_batch": dynamic_batch,
        "run_time_shape": run_time_shape,
        "zero_size": zero_size,
        "segment_embeddings": segment_embeddings,
        "video_cnn": video_cnn,
        "custom_op": custom_op,
        "int4_mlp": int4_mlp,
        "int4_blockwise_mlp": int4_blockwise_mlp,
    }


def builder_model_bytes() -> dict[str, bytes]:
    """Each builder model's serialized bytes, by file stem."""
    from tflite_tools import serialize

    return {name: serialize(make()) for name, make in _builder_models().items()}


def make_builder(out: Path) -> list[Path]:
    """Writes the builder models to `out`."""
    from tflite_tools.model.atomic import write_bytes_atomic

    paths = []
    for name, data in builder_model_bytes().items():
        path = out / f"{name}.tflite"
        write_bytes_atomic(path, data)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------------------------
# Real converter output, small versions of the reference models.


def make_tensorflow(out: Path, only: set[str] | None = None) -> list[Path]:
    """Converts small Keras / tf.function models with TensorFlow and writes them to `out` (those
    named in `only`, when given: the others' bytes move with the TensorFlow version)."""
    import tensorflow as tf

    from tflite_tools.model.atomic import write_bytes_atomic

    keras = tf.keras
    tf.random.set_seed(7)
    keras.utils.set_random_seed(7)
    paths = []

    def write(name: str, data: bytes) -> None:
        if only and name not in only:
            return
        path = out / f"{name}.tflite"
        write_bytes_atomic(path, data)
        paths.append(path)

    def from_keras(model, **settings) -> bytes:
        conv = tf.lite.TFLiteConverter.from_keras_model(model)
        for key, value in settings.items():
            setattr(conv, key, value)
        return conv.convert()

    # MobileNetV2 at alpha 0.35 on 96x96, 16 classes: CONV/DEPTHWISE + RELU6, residual ADD, MEAN, FC.
    mobilenet = keras.applications.MobileNetV2(
        alpha=0.35, input_tensor=keras.Input((96, 96, 3), batch_size=1), weights=None, classes=16
    )
    write("mobilenet_v2_035_96", from_keras(mobilenet))
    # The same with float16 weights: a DEQUANTIZE in front of every weight, as phones get them.
    write("mobilenet_v2_035_96_fp16", from_keras(mobilenet, optimizations=[tf.lite.Optimize.DEFAULT],
                                                 target_spec=_fp16_spec(tf)))

    def full_integer(model, sample: Callable[[np.random.Generator], list[np.ndarray]], float_io: bool = False,
                     int16: bool = False) -> bytes:
        """`model` with int8 activations and weights throughout (with `int16`, int16 activations:
        16x8), calibrated on 16 drawn samples; integer input and output too, or with `float_io`
        float ones (QUANTIZE / DEQUANTIZE at the edges)."""
        def representative():
            rng = np.random.default_rng(0)
            for _ in range(16):
                yield sample(rng)

        io_type = tf.int16 if int16 else tf.int8
        io = {} if float_io else {"inference_input_type": io_type, "inference_output_type": io_type}
        return from_keras(model, optimizations=[tf.lite.Optimize.DEFAULT], representative_dataset=representative,
                          target_spec=_int8_spec(tf, int16), **io)

    write("mobilenet_v2_035_96_int8",
          full_integer(mobilenet, lambda rng: [rng.uniform(-1, 1, (1, 96, 96, 3)).astype(np.float32)]))

    # One transformer encoder layer, seq 32, hidden 64: GATHER embedding, LayerNorm decomposed,
    # attention as RESHAPE/TRANSPOSE/BATCH_MATMUL/SOFTMAX, GELU feed-forward.
    tokens = keras.Input((32,), batch_size=1, dtype="int32", name="input_ids")
    h = keras.layers.Embedding(1000, 64)(tokens)
    h = h + keras.layers.Embedding(32, 64)(tf.range(32)[tf.newaxis, :])
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
    a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=32)(h, h)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h + a)
    f = keras.layers.Dense(128, activation="gelu")(h)
    f = keras.layers.Dense(64)(f)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(h + f)
    encoder = keras.Model(tokens, h)
    write("transformer_encoder", from_keras(encoder))
    write("transformer_encoder_fp16", from_keras(encoder, optimizations=[tf.lite.Optimize.DEFAULT],
                                                 target_spec=_fp16_spec(tf)))

    # Tiny U-Net on 32x32: MAX_POOL_2D, TRANSPOSE_CONV, CONCATENATION skips, LOGISTIC head.
    image = keras.Input((32, 32, 3), batch_size=1, name="image")

    def double_conv(x, ch):
        for _ in range(2):
            x = keras.layers.Conv2D(ch, 3, padding="same", use_bias=False)(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.ReLU()(x)
        return x

    s1 = double_conv(image, 8)
    s2 = double_conv(keras.layers.MaxPooling2D()(s1), 16)
    bottom = double_conv(keras.layers.MaxPooling2D()(s2), 32)
    u2 = keras.layers.Conv2DTranspose(16, 2, strides=2)(bottom)
    u2 = double_conv(keras.layers.Concatenate()([u2, s2]), 16)
    u1 = keras.layers.Conv2DTranspose(8, 2, strides=2)(u2)
    u1 = double_conv(keras.layers.Concatenate()([u1, s1]), 8)
    mask = keras.layers.Conv2D(2, 1, activation="sigmoid")(u1)
    unet = keras.Model(image, mask)
    write("unet_tiny", from_keras(unet))
    # The same full-integer: int8 TRANSPOSE_CONV, CONCATENATION (one scale), MAX_POOL_2D, LOGISTIC.
    write("unet_tiny_int8", full_integer(unet, lambda rng: [rng.uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)]))

    # Small convolution with float16 weights: DEQUANTIZE of constants for constant folding.
    x_in = keras.Input((16, 16, 4), batch_size=1)
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x_in)
    y = keras.layers.DepthwiseConv2D(3, padding="same")(y)
    fp16 = keras.Model(x_in, y)
    write(
        "conv_fp16_weights",
        from_keras(fp16, optimizations=[tf.lite.Optimize.DEFAULT], target_spec=_fp16_spec(tf)),
    )

    # Sparse weights: FULLY_CONNECTED reads them sparse; CONV_2D gets a DENSIFY in front.
    def sparse(layer_input, layer, weight_shape, mask):
        model = keras.Model(layer_input, layer(layer_input))
        w = np.random.default_rng(5).standard_normal(weight_shape).astype(np.float32) * mask
        layer.set_weights([w, np.zeros(weight_shape[-1], np.float32)])
        return from_keras(model, optimizations=[tf.lite.Optimize.EXPERIMENTAL_SPARSITY])

    fc_mask = np.zeros((64, 64), np.float32)
    fc_mask[:, ::8] = 1
    write("sparse_fc", sparse(keras.Input((64,), batch_size=1), keras.layers.Dense(64), (64, 64), fc_mask))
    conv_mask = np.ones((3, 3, 16, 16), np.float32)
    conv_mask[..., ::2, :] = 0
    conv_mask[..., 1::4, :] = 0
    write("sparse_conv_densify", sparse(keras.Input((8, 8, 16), batch_size=1),
                                        keras.layers.Conv2D(16, 3, padding="same"), (3, 3, 16, 16), conv_mask))

    # Sparse fp16 weights, as published pose detectors ship their 1x1 convs: DENSIFY -> DEQUANTIZE.
    inputs = keras.Input((8, 8, 16), batch_size=1)
    convs = [keras.layers.Conv2D(32, 1, activation="relu"), keras.layers.Conv2D(16, 1)]
    pointwise = keras.Model(inputs, convs[1](convs[0](inputs)))
    rng = np.random.default_rng(5)
    for conv, shape in zip(convs, [(1, 1, 16, 32), (1, 1, 32, 16)]):
        w = rng.standard_normal(shape).astype(np.float32) * (rng.random(shape) < 0.2)
        conv.set_weights([w, rng.standard_normal(shape[-1]).astype(np.float32)])
    fp16 = tf.lite.TargetSpec()
    fp16.supported_types = [tf.float16]
    write("sparse_fp16_conv", from_keras(pointwise, target_spec=fp16, optimizations=[
        tf.lite.Optimize.EXPERIMENTAL_SPARSITY, tf.lite.Optimize.DEFAULT]))

    # Control flow: a WHILE loop makes three subgraphs (main, cond, body).
    class Loop(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
        def __call__(self, x):
            i = tf.constant(0)
            _, y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.tanh(v * 1.5 + 0.1)), [i, x])
            return y

    loop = Loop()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([loop.__call__.get_concrete_function()], loop)
    write("while_loop", conv.convert())

    # A dynamic batch dimension: shape_signature [-1, 8].
    class Dynamic(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def __call__(self, x):
            return tf.nn.relu(tf.matmul(x, self.w))

    dyn = Dynamic()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([dyn.__call__.get_concrete_function()], dyn)
    write("dynamic_batch_matmul", conv.convert())

    # Models added later go last, so that the ones above are built from the same random state as before.
    # The transformer encoder full-integer, float output: int8 FULLY_CONNECTED, BATCH_MATMUL of two
    # activations, SOFTMAX, MEAN, SQUARED_DIFFERENCE, RSQRT, MUL; a float NEG between DEQUANTIZE and
    # QUANTIZE; a DEQUANTIZE at the output.
    write("transformer_encoder_int8",
          full_integer(encoder, lambda rng: [rng.integers(0, 1000, (1, 32)).astype(np.int32)], float_io=True))

    # 16x8 (int16 activations, int8 weights, int64 biases), as audio and super-resolution models are
    # converted: CONV_2D, DEPTHWISE_CONV_2D, ADD (general scales), MAX_POOL_2D, FULLY_CONNECTED,
    # LOGISTIC, MEAN and SOFTMAX.
    image16 = keras.Input((32, 32, 3), batch_size=1)
    c = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image16)
    c = keras.layers.DepthwiseConv2D(3, padding="same")(c)
    c = keras.layers.Add()([c, keras.layers.Conv2D(8, 1)(c)])
    c = keras.layers.MaxPooling2D()(c)
    c = keras.layers.Conv2D(16, 3, padding="same", activation="sigmoid")(c)
    c = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(c))
    cnn16 = keras.Model(image16, keras.layers.Softmax()(c))
    write("cnn_16x8", full_integer(cnn16, lambda rng: [rng.uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)],
                                   int16=True))

    # 16x8 attention without LayerNorm (whose SQUARED_DIFFERENCE LiteRT cannot run on int16): BATCH_MATMUL
    # of two int16 activations, MUL, SOFTMAX (SoftmaxInt16's tables), GELU, TANH and LOGISTIC by table.
    seq16 = keras.Input((16, 32), batch_size=1)
    h = seq16 + keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(seq16, seq16)
    f = keras.layers.Dense(32, activation="tanh")(keras.layers.Dense(64, activation="gelu")(h))
    f = keras.layers.Dense(32, activation="sigmoid")(keras.layers.Multiply()([f, h]))
    attention16 = keras.Model(seq16, h + f)
    write("attention_16x8", full_integer(attention16, lambda rng: [rng.standard_normal((1, 16, 32)).astype(np.float32)],
                                         int16=True))

    # 16x8 image ops: AVERAGE_POOL_2D, CONCATENATION, PAD, RELU6, MUL, LEAKY_RELU, RESIZE_BILINEAR,
    # TRANSPOSE_CONV, and the QUANTIZE between scales the converter puts before a concatenation.
    image16b = keras.Input((16, 16, 3), batch_size=1)
    c = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(image16b)
    c = keras.layers.Concatenate()([keras.layers.AveragePooling2D(2)(c), keras.layers.MaxPooling2D(2)(c)])
    c = keras.layers.DepthwiseConv2D(3, activation=tf.nn.relu6)(keras.layers.ZeroPadding2D(1)(c))
    c = keras.layers.LeakyReLU(0.1)(keras.layers.Multiply()([c, c]))
    u = keras.layers.UpSampling2D(interpolation="bilinear")(c)
    t = keras.layers.Conv2DTranspose(4, 2, strides=2)(c)
    images16 = keras.Model(image16b, keras.layers.Concatenate()([keras.layers.Conv2D(4, 1)(u), t]))
    write("image_ops_16x8", full_integer(images16, lambda rng: [rng.uniform(-1, 1, (1, 16, 16, 3)).astype(np.float32)],
                                         int16=True))

    # The transformer encoder under dynamic-range quantization (Optimize.DEFAULT, no representative
    # data): int8 weights, per channel, beside float activations, each FULLY_CONNECTED quantizing its
    # input per row as it runs (asymmetric_quantize_inputs).
    write("transformer_encoder_dynamic_range", from_keras(encoder, optimizations=[tf.lite.Optimize.DEFAULT]))
    # MobileNetV2 the same way: CONV_2D and DEPTHWISE_CONV_2D with per-channel int8 weights quantize
    # each input image (asymmetric) as they run.
    write("mobilenet_v2_035_96_dynamic_range", from_keras(mobilenet, optimizations=[tf.lite.Optimize.DEFAULT]))

    # A decoder's signatures, as generative models ship: prefill at two lengths and a one-token decode,
    # sharing weights: RMSNorm (MUL/MEAN/RSQRT), FULLY_CONNECTED with a fused RELU, SiLU, a residual.
    class Decoder(tf.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(11)
            self.up = tf.constant(rng.standard_normal((16, 32)).astype(np.float32) * 0.3)
            self.gate = tf.constant(rng.standard_normal((16, 32)).astype(np.float32) * 0.3)
            self.down = tf.constant(rng.standard_normal((32, 16)).astype(np.float32) * 0.3)
            self.scale = tf.constant(rng.uniform(0.5, 1.5, 16).astype(np.float32))

        def layer(self, x):
            h = x * tf.math.rsqrt(tf.reduce_mean(x * x, axis=-1, keepdims=True) + 1e-6) * self.scale
            h = tf.nn.silu(tf.matmul(h, self.gate)) * tf.nn.relu(tf.matmul(h, self.up))
            return {"y": x + tf.matmul(h, self.down)}

        @tf.function(input_signature=[tf.TensorSpec([1, 8, 16], tf.float32)])
        def prefill_8(self, x):
            return self.layer(x)

        @tf.function(input_signature=[tf.TensorSpec([1, 16, 16], tf.float32)])
        def prefill_16(self, x):
            return self.layer(x)

        @tf.function(input_signature=[tf.TensorSpec([1, 1, 16], tf.float32)])
        def decode(self, x):
            return self.layer(x)

    decoder = Decoder()
    signatures = {name: getattr(decoder, name) for name in ("decode", "prefill_8", "prefill_16")}
    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(decoder, saved, signatures=signatures)
        conv = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=list(signatures))
        write("decoder_signatures", conv.convert())

    # One attention layer with an external KV cache, as on-device decoders ship: prefill (4 tokens)
    # and decode signatures, the caches [1, 16, 2, 8] passed in and out, DYNAMIC_UPDATE_SLICE at the
    # input position, a causal mask built from it.
    from tensorflow.compiler.tf2xla.python import xla

    length, heads, depth, width = 16, 2, 8, 16

    class CachedAttention(tf.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(12)
            self.wq, self.wk, self.wv, self.wo = (
                tf.constant(rng.standard_normal((width, width)).astype(np.float32) * 0.3) for _ in range(4))

        def step(self, x, k_cache, v_cache, pos):
            tokens = x.shape[1]

            def heads_of(w):
                return tf.reshape(tf.matmul(x, w), [1, tokens, heads, depth])

            start = tf.stack([0, pos[0], 0, 0])
            k_cache = xla.dynamic_update_slice(k_cache, heads_of(self.wk), start)
            v_cache = xla.dynamic_update_slice(v_cache, heads_of(self.wv), start)
            scores = tf.einsum("bthd,bshd->bhts", heads_of(self.wq), k_cache) / np.sqrt(depth)
            visible = tf.range(length)[None, :] <= (pos[0] + tf.range(tokens))[:, None]
            scores += (1 - tf.cast(visible, tf.float32)) * -1e9
            attended = tf.einsum("bhts,bshd->bthd", tf.nn.softmax(scores), v_cache)
            y = x + tf.matmul(tf.reshape(attended, [1, tokens, width]), self.wo)
            return {"y": y, "k_cache": k_cache, "v_cache": v_cache}

        cache = tf.TensorSpec([1, length, heads, depth], tf.float32)
        position = tf.TensorSpec([1], tf.int32)

        @tf.function(input_signature=[tf.TensorSpec([1, 4, width], tf.float32), cache, cache, position])
        def prefill(self, x, k_cache, v_cache, pos):
            return self.step(x, k_cache, v_cache, pos)

        @tf.function(input_signature=[tf.TensorSpec([1, 1, width], tf.float32), cache, cache, position])
        def decode(self, x, k_cache, v_cache, pos):
            return self.step(x, k_cache, v_cache, pos)

    cached = CachedAttention()
    signatures = {"decode": cached.decode, "prefill": cached.prefill}
    with tempfile.TemporaryDirectory() as saved:
        tf.saved_model.save(cached, saved, signatures=signatures)
        conv = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=list(signatures))
        write("kv_cache_decoder", conv.convert())

    # An encoder layer with open batch and sequence dimensions ([None, None, 32]), as Keras models
    # convert without fixed shapes: the head reshapes take their shape from SHAPE of the input.
    class OpenEncoder(tf.Module):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(13)
            self.wq, self.wk, self.wv, self.wo = (
                tf.constant(rng.standard_normal((32, 32)).astype(np.float32) * 0.2) for _ in range(4))
            self.up = tf.constant(rng.standard_normal((32, 64)).astype(np.float32) * 0.2)
            self.down = tf.constant(rng.standard_normal((64, 32)).astype(np.float32) * 0.2)

        @tf.function(input_signature=[tf.TensorSpec([None, None, 32], tf.float32)])
        def __call__(self, x):
            batch, tokens = tf.shape(x)[0], tf.shape(x)[1]

            def heads(w):
                return tf.transpose(tf.reshape(tf.matmul(x, w), [batch, tokens, 4, 8]), [0, 2, 1, 3])

            scores = tf.matmul(heads(self.wq), heads(self.wk), transpose_b=True) / np.sqrt(8.0)
            attended = tf.transpose(tf.matmul(tf.nn.softmax(scores), heads(self.wv)), [0, 2, 1, 3])
            h = x + tf.matmul(tf.reshape(attended, [batch, tokens, 32]), self.wo)
            mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
            h = (h - mean) * tf.math.rsqrt(variance + 1e-5)
            return h + tf.matmul(tf.nn.gelu(tf.matmul(h, self.up)), self.down)

    encoder = OpenEncoder()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([encoder.__call__.get_concrete_function()], encoder)
    write("encoder_open_shapes", conv.convert())

    # An encoder layer whose sequence is open ([1, None, 32]) and whose reshapes say -1 for it, so
    # LiteRT sizes every tensor at any length when the model is prepared (a prompt as long as it is).
    class OpenSequence(OpenEncoder):
        def __init__(self):
            super().__init__()
            self.bias = tf.constant(np.random.default_rng(17).standard_normal(64).astype(np.float32) * 0.1)

        @tf.function(input_signature=[tf.TensorSpec([1, None, 32], tf.float32)])
        def __call__(self, x):
            def heads(w):
                return tf.transpose(tf.reshape(tf.matmul(x, w), [1, -1, 4, 8]), [0, 2, 1, 3])

            scores = tf.matmul(heads(self.wq), heads(self.wk), transpose_b=True) / np.sqrt(8.0)
            attended = tf.transpose(tf.matmul(tf.nn.softmax(scores), heads(self.wv)), [0, 2, 1, 3])
            h = x + tf.matmul(tf.reshape(attended, [1, -1, 32]), self.wo)
            mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
            h = (h - mean) * tf.math.rsqrt(variance + 1e-5)
            return h + tf.matmul(tf.nn.gelu(tf.matmul(h, self.up) + self.bias, approximate=True), self.down)

    sequence = OpenSequence()
    conv = tf.lite.TFLiteConverter.from_concrete_functions([sequence.__call__.get_concrete_function()], sequence)
    write("encoder_open_sequence", conv.convert())

    # Decoders as the decoder corpus builds them (bench/decoders.py), at a tiny size: prefill_4,
    # prefill_8 and decode over a 16-position KV cache. Gemma-style in float (one key/value head, a
    # GELU-tanh gate; the converter numbers its two prefills' tensors differently), Llama-style with
    # ai-edge-quantizer's dynamic int4 weights, Qwen-style with TFLite's dynamic-range int8 (these
    # two with prefill_8 only).
    sys.path.insert(0, str(HERE.parents[1] / "bench"))
    from decoders import Decoder, convert

    for name, style, kv_heads, precision, prefill in (
            ("tiny_gemma_decoder", "gemma", 1, "", (4, 8)),
            ("tiny_llama_decoder_int4", "llama", 2, "_int4", (8,)),
            ("tiny_qwen_decoder_dynamic_range", "qwen", 2, "_dynamic_range", (8,))):
        if not only or name in only:
            with tempfile.TemporaryDirectory() as saved:
                tiny = Decoder(style, 64, 32, 2, 4, kv_heads, 8, 64, 16, prefill)
                write(name, convert(tf, tiny, precision, Path(saved) / "model"))
    return paths


def _int8_spec(tf, int16_activations: bool = False):
    spec = tf.lite.TargetSpec()
    spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
                          if int16_activations else tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return spec


def _fp16_spec(tf):
    spec = tf.lite.TargetSpec()
    spec.supported_types = [tf.float16]
    return spec


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: regenerate the builder and/or TensorFlow models."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["builder", "tensorflow", "all"], nargs="?", default="builder")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="converter models to write (default: all)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parents[1]))  # run from a checkout without installing
    written = []
    if args.which in ("builder", "all"):
        written += make_builder(args.out)
    if args.which in ("tensorflow", "all"):
        written += make_tensorflow(args.out, set(args.only or ()))
    for path in written:
        print(f"{path.name:<32} {path.stat().st_size:>9} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
