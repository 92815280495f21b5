"""Runtime selection: LiteRT first, tflite_runtime as the fallback, and a clear error otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from tflite_tools import runtime
from conftest import REPO


def run_python(code: str, env_extra: dict[str, str], pythonpath: list[Path]) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*pythonpath, REPO])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=120)


def fake_tflite_runtime(tmp_path: Path) -> Path:
    """A stand-in `tflite_runtime` package (the real 2.14 wheel needs numpy < 2, see README)."""
    pkg = tmp_path / "tflite_runtime"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "interpreter.py").write_text(
        "from ai_edge_litert.interpreter import Interpreter, OpResolverType, load_delegate\n"
        "FAKE = True\n"
    )
    return tmp_path


def test_litert_is_the_default():
    assert runtime.RUNTIME in ("ai_edge_litert", "tflite_runtime")
    proc = run_python("from tflite_tools import runtime; print(runtime.RUNTIME)", {"DNNFUSION_RUNTIME": ""}, [])
    assert proc.stdout.strip() == "ai_edge_litert", proc.stderr


def test_tflite_runtime_is_used_when_asked_and_runs_a_model(tmp_path):
    code = """
        from tflite_tools import runtime
        interp = runtime.make_interpreter("tests/models/add_relu.tflite")
        out = runtime.run(interp, runtime.random_inputs(interp))
        print(runtime.RUNTIME, runtime._interpreter.FAKE, out[0].shape)
    """
    result = run_python(code, {"DNNFUSION_RUNTIME": "tflite_runtime"}, [fake_tflite_runtime(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:2] == ["tflite_runtime", "True"]


def test_falls_back_when_litert_interpreter_is_missing(tmp_path):
    # Hide ai_edge_litert.interpreter from tflite_tools' first attempt only: the stand-in
    # tflite_runtime imports it too. (The schema always comes from ai-edge-litert.)
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(textwrap.dedent("""
        import sys
        class BlockOnce:
            def find_spec(self, name, path=None, target=None):
                if name == "ai_edge_litert.interpreter":
                    sys.meta_path.remove(self)
                    raise ImportError("blocked for the test")
        sys.meta_path.insert(0, BlockOnce())
    """))
    result = run_python("from tflite_tools import runtime; print(runtime.RUNTIME)", {}, [fake_tflite_runtime(tmp_path)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "tflite_runtime"


def test_unknown_runtime_name_is_rejected():
    result = run_python("import tflite_tools.runtime", {"DNNFUSION_RUNTIME": "onnxruntime"}, [])
    assert result.returncode != 0
    assert "unknown runtime 'onnxruntime'" in result.stderr


def test_random_inputs_respect_dtypes(model_path):
    interp = runtime.make_interpreter(model_path("int8_add"))
    a, b = runtime.random_inputs(interp, seed=5)
    assert a.dtype == np.int8 and a.shape == (1, 8, 3)
    assert a.min() < 0 < a.max()
    interp = runtime.make_interpreter(model_path("transformer_encoder"))
    (ids,) = runtime.random_inputs(interp)
    assert ids.dtype == np.int32 and 0 <= ids.min() and ids.max() < 16
