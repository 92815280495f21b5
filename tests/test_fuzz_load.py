"""Property test: bytes of real models, mutated, either load or raise ModelError — nothing else.

Whatever loads must also survive `info` and a save, or fail with ModelError, so a damaged file
can never crash the tools or make them print a traceback.
"""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tflite_tools
from tflite_tools import ModelError
from tflite_tools.info import model_info
from conftest import MODELS

# Small seeds keep each example fast; together they cover control flow, quantization, custom
# ops, optional inputs, fp16 constants and a real converter graph with signatures and metadata.
SEEDS = ["fc_softmax", "fc_no_bias", "while_loop", "int8_add", "custom_op", "conv_fp16_weights", "split_outputs"]


@lru_cache(maxsize=None)
def seed_bytes(stem: str) -> bytes:
    return (MODELS / f"{stem}.tflite").read_bytes()


@st.composite
def mutated_models(draw) -> bytes:
    data = bytearray(seed_bytes(draw(st.sampled_from(SEEDS))))
    kind = draw(st.sampled_from(["overwrite", "truncate", "delete", "insert", "offsets"]))
    if kind == "overwrite":
        for _ in range(draw(st.integers(1, 16))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif kind == "truncate":
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif kind == "delete":
        start = draw(st.integers(0, len(data) - 1))
        del data[start : start + draw(st.integers(1, 64))]
    elif kind == "insert":
        at = draw(st.integers(0, len(data)))
        data[at:at] = draw(st.binary(min_size=1, max_size=64))
    else:
        # Rewrite an aligned 32-bit word: flatbuffers are offsets and lengths, so this hits them.
        at = draw(st.integers(0, len(data) // 4 - 1)) * 4
        word = draw(st.sampled_from([0, 1, 3, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000, len(data), len(data) - 4]))
        data[at : at + 4] = word.to_bytes(4, "little")
    return bytes(data)


@settings(
    max_examples=400,
    deadline=timedelta(seconds=5),  # a hang shows up as a deadline failure
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(mutated_models())
def test_mutated_models_load_or_raise_model_error(data: bytes) -> None:
    try:
        model = tflite_tools.parse(data, source="mutated.tflite")
    except ModelError as exc:
        assert str(exc).startswith("mutated.tflite: ")
        assert "\n" not in str(exc)
        return
    try:
        model_info(model)
        tflite_tools.serialize(model)
    except ModelError:
        pass
