"""`run`'s never-worse rule for quantized outputs: more than one step off the reference passes only
when LiteRT + XNNPACK alone is at least as far off on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tflite_tools import run as run_module
from tflite_tools.run import OutputError, compare, never_worse


@pytest.mark.parametrize("ours, stock, ok", [(2, 2, True), (2, 3, True), (3, 2, False), (1, 5, True)])
def test_quantized_output_no_further_off_than_stock_litert(monkeypatch, ours, stock, ok):
    expected = [np.zeros(4, np.int8)]
    outputs = [np.array([0, ours, 0, 0], np.int8)]
    monkeypatch.setattr(run_module.runtime, "make_interpreter", lambda *args, **kwargs: None)
    monkeypatch.setattr(run_module.runtime, "run", lambda interp, arrays: [np.array([stock, 0, 0, 0], np.int8)])
    errors = compare(outputs, expected, ["y"], quantized=[True])
    assert errors[0].ok is (ours <= 1)
    never_worse(errors, [True], "model.tflite", [], expected, 1)
    assert errors[0].ok is ok
    assert errors[0].stock_max_abs == (stock if ours > 1 else None)


def test_float_outputs_are_never_excused(monkeypatch):
    monkeypatch.setattr(run_module.runtime, "make_interpreter", lambda *args, **kwargs: None)
    monkeypatch.setattr(run_module.runtime, "run", lambda interp, arrays: [np.array([9.0], np.float32)])
    errors = [OutputError("y", 1.0, 1.0, False)]
    never_worse(errors, [False], "model.tflite", [], [np.array([0.0], np.float32)], 1)
    assert not errors[0].ok and errors[0].stock_max_abs is None
