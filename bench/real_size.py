"""The real-size corpus: architectures at the sizes their families ship (BERT-base at 128 tokens,
GPT-2 124M, a SmolLM-135M-shaped Llama prefill, DeiT-tiny and EfficientNet-B0 at 224, SegFormer-B0
at 512, C3D over 16 frames of 112x112), built from keras-hub's and Keras' own layers with random
weights, float32 and, where the family ships that way, TFLite's dynamic-range quantization (int8
weights, float activations). `bench/corpus.py build --set real` converts them; the checks and
timings are corpus.py's.
"""

from __future__ import annotations

from typing import Callable

# name -> recipe(tf) returning (keras model, converter settings), as corpus.RECIPES.
REAL_SIZE: dict[str, Callable] = {}
DYNAMIC_RANGE = "_dynamic_range"


def _add(name: str, dynamic_range: bool):
    """Registers a float recipe, and its dynamic-range twin when the family ships one."""
    def add(fn: Callable) -> Callable:
        REAL_SIZE[name] = fn
        if dynamic_range:
            REAL_SIZE[name + DYNAMIC_RANGE] = lambda tf: (fn(tf)[0], {"optimizations": [tf.lite.Optimize.DEFAULT]})
        return fn
    return add


TOKENS = ("token_ids", "padding_mask")
SEGMENTS = ("token_ids", "segment_ids", "padding_mask")
TEXT_LENGTH = 128

# name -> (keras-hub backbone, its arguments, the inputs it takes, whether a dynamic-range twin ships)
TEXT_MODELS = {
    # BERT-base: 12 layers, hidden 768, 12 heads, with segment ids.
    "bert_base": ("BertBackbone", dict(vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768,
                                       intermediate_dim=3072, dropout=0.0), SEGMENTS, True),
    # TinyBERT-4: 4 layers, hidden 312, 12 heads of 26 (no vector width divides it).
    "tinybert_4l_312": ("BertBackbone", dict(vocabulary_size=30522, num_layers=4, num_heads=12, hidden_dim=312,
                                             intermediate_dim=1200, dropout=0.0), SEGMENTS, True),
    # DistilBERT-base: 6 layers, hidden 768.
    "distilbert_base": ("DistilBertBackbone", dict(vocabulary_size=30522, num_layers=6, num_heads=12, hidden_dim=768,
                                                   intermediate_dim=3072, dropout=0.0), TOKENS, False),
    # ALBERT-base: one shared layer applied 12 times, 128-wide factorized embeddings.
    "albert_base": ("AlbertBackbone", dict(vocabulary_size=30000, num_layers=12, num_heads=12, embedding_dim=128,
                                           hidden_dim=768, intermediate_dim=3072), SEGMENTS, False),
    # GPT-2 small (124M): 12 causal layers, hidden 768.
    "gpt2_124m": ("GPT2Backbone", dict(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
                                       intermediate_dim=3072, dropout=0.0), TOKENS, True),
    # A Llama-style decoder's prefill at SmolLM-135M's shape: RMSNorm, RoPE, SwiGLU, 9 query heads
    # sharing 3 key/value heads, a causal mask, 30 layers of hidden 576.
    "llama_prefill": ("LlamaBackbone", dict(vocabulary_size=49152, num_layers=30, num_query_heads=9,
                                            num_key_value_heads=3, hidden_dim=576, intermediate_dim=1536), TOKENS, True),
}


def _text(backbone: str, arguments: dict, names: tuple[str, ...]):
    """A recipe: the keras-hub text backbone with its inputs fixed at batch 1 and TEXT_LENGTH tokens;
    its sequence output (the hidden states every task head reads)."""
    def make(tf):
        import keras
        import keras_hub

        model = getattr(keras_hub.models, backbone)(**arguments)
        inputs = {name: keras.Input((TEXT_LENGTH,), batch_size=1, dtype="int32", name=name) for name in names}
        out = model(inputs)
        return keras.Model(inputs, out["sequence_output"] if isinstance(out, dict) else out), {}
    return make


for _name, (_backbone, _arguments, _names, _dynamic) in TEXT_MODELS.items():
    _add(_name, _dynamic)(_text(_backbone, _arguments, _names))


@_add("deit_tiny_224", dynamic_range=True)
def _deit(tf):
    """DeiT-tiny / ViT-Ti at 224: 16x16 patches, 12 layers of hidden 192, 3 heads."""
    import keras
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(image_shape=(224, 224, 3), patch_size=16, num_layers=12, num_heads=3,
                                            hidden_dim=192, mlp_dim=768)
    images = keras.Input((224, 224, 3), batch_size=1)
    return keras.Model(images, backbone(images)), {}


@_add("efficientnet_b0_224", dynamic_range=True)
def _efficientnet(tf):
    """EfficientNet-B0 at 224 with its classifier."""
    return tf.keras.applications.EfficientNetB0(input_tensor=tf.keras.Input((224, 224, 3), batch_size=1),
                                                weights=None), {}


@_add("segformer_b0_512", dynamic_range=False)
def _segformer(tf):
    """SegFormer-B0 at 512x512: the MiT-B0 encoder (1/2/5/8 heads over widths 32/64/160/256, spatial
    reduction attention, Mix-FFN) and the all-MLP decoder."""
    import keras
    import keras_hub

    encoder = keras_hub.models.MiTBackbone(
        layerwise_depths=[2, 2, 2, 2], num_layers=4, layerwise_num_heads=[1, 2, 5, 8],
        layerwise_sr_ratios=[8, 4, 2, 1], max_drop_path_rate=0.0, layerwise_patch_sizes=[7, 3, 3, 3],
        layerwise_strides=[4, 2, 2, 2], image_shape=(512, 512, 3), hidden_dims=[32, 64, 160, 256])
    backbone = keras_hub.models.SegFormerBackbone(image_encoder=encoder, projection_filters=256)
    images = keras.Input((512, 512, 3), batch_size=1)
    return keras.Model(images, backbone(images)), {}


@_add("c3d_112", dynamic_range=False)
def _c3d(tf):
    """C3D over 16 frames of 112x112: eight 3x3x3 convolutions with ReLU, then two 4096-wide fully
    connected layers. TFLite has no 3-D max pooling: it is written as the converter can take it,
    a 2-D pool over each frame, then a maximum over pairs of frames."""
    layers = tf.keras.layers

    def pool(x, frames: int):
        def pool_frames(v):
            _, t, h, w, c = v.shape  # batch 1: the frames become the batch of a 2-D pool
            v = tf.nn.max_pool2d(tf.reshape(v, (t, h, w, c)), 2, 2, "VALID")
            if frames == 2:
                v = tf.reduce_max(tf.reshape(v, (t // 2, 2, h // 2, w // 2, c)), axis=1)
            return v[tf.newaxis]
        return layers.Lambda(pool_frames)(x)

    x = clip = tf.keras.Input((16, 112, 112, 3), batch_size=1)
    for channels, convs, frames in [(64, 1, 1), (128, 1, 2), (256, 2, 2), (512, 2, 2), (512, 2, 2)]:
        for _ in range(convs):
            x = layers.Conv3D(channels, 3, padding="same", activation="relu")(x)
        x = pool(x, frames)
    x = layers.Dense(4096, activation="relu")(layers.Dense(4096, activation="relu")(layers.Flatten()(x)))
    return tf.keras.Model(clip, layers.Dense(487, activation="softmax")(x)), {}


@_add("mobilenet_v2_sparse_fp16_224", dynamic_range=False)
def _sparse_fp16(tf):
    """MobileNetV2 at 224 stored as published pose and landmark detectors store theirs: pointwise
    convolutions pruned to 1 weight in 5, converted with the sparsity optimization and fp16
    weights (DENSIFY -> DEQUANTIZE in front of each)."""
    import numpy as np

    model = tf.keras.applications.MobileNetV2(input_tensor=tf.keras.Input((224, 224, 3), batch_size=1), weights=None,
                                              classifier_activation=None)  # logits: a softmax of them is flat
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.Conv2D) and layer.kernel_size == (1, 1):
            w, *rest = layer.get_weights()
            layer.set_weights([w * (rng.random(w.shape) < 0.2), *rest])
    spec = tf.lite.TargetSpec()
    spec.supported_types = [tf.float16]
    return model, {"optimizations": [tf.lite.Optimize.EXPERIMENTAL_SPARSITY, tf.lite.Optimize.DEFAULT],
                   "target_spec": spec}
