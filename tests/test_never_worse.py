"""`run`'s never-worse rule: an output outside the tolerance passes only when stock LiteRT + XNNPACK
is no closer to the reference on the same inputs (quantized: as many steps off; float: stock is off
too and this output is stock's answer)."""

from __future__ import annotations

import numpy as np
import pytest

from tflite_tools import run as run_module
from tflite_tools.run import compare, never_worse


@pytest.mark.parametrize("ours, stock, ok", [(2, 2, True), (2, 3, True), (3, 2, False), (1, 5, True)])
def test_quantized_output_no_further_off_than_stock_litert(monkeypatch, ours, stock, ok):
    expected = [np.zeros(4, np.int8)]
    outputs = [np.array([0, ours, 0, 0], np.int8)]
    monkeypatch.setattr(run_module.runtime, "make_interpreter", lambda *args, **kwargs: None)
    monkeypatch.setattr(run_module.runtime, "run", lambda interp, arrays: [np.array([stock, 0, 0, 0], np.int8)])
    errors = compare(outputs, expected, ["y"], quantized=[True])
    assert errors[0].ok is (ours <= 1)
    never_worse(errors, outputs, [True], "model.tflite", [], expected, 1)
    assert errors[0].ok is ok
    assert errors[0].stock_max_abs == (stock if ours > 1 else None)


NAN = float("nan")


@pytest.mark.parametrize("ours, stock, ok", [
    ([NAN, 1.0], [NAN, 1.0], True),    # stock is off the reference the same way: no worse
    ([NAN, 1.0], [2.0, 1.0], False),   # stock matches the reference: ours is worse
    ([NAN, 1.0], [NAN, 5.0], False),   # stock is off, but ours is not stock's answer either
])
def test_float_output_passes_only_as_stock_litert_answers(monkeypatch, ours, stock, ok):
    expected = [np.array([2.0, 1.0], np.float32)]
    outputs = [np.array(ours, np.float32)]
    monkeypatch.setattr(run_module.runtime, "make_interpreter", lambda *args, **kwargs: None)
    monkeypatch.setattr(run_module.runtime, "run", lambda interp, arrays: [np.array(stock, np.float32)])
    errors = compare(outputs, expected, ["y"])
    assert not errors[0].ok
    never_worse(errors, outputs, [False], "model.tflite", [], expected, 1)
    assert errors[0].ok is ok and errors[0].stock_max_abs is not None
