"""The mutation fuzzer: damage the compile cache or a fuse output (truncate, garbage, zero, append,
delete, swap two files) and use them again. Whatever the damage, the tools exit 0 with a right
answer or 2 with one line: never a crash (a signal), never a traceback, never a wrong answer
(`run --compare` exiting 1).

CI runs a small fixed budget. By hand, thousands (figures in bench/RESULTS.md):

    DNNFUSION_MUTATION_CASES=2000 python -m pytest tests/test_mutation_fuzz.py -p no:cacheprovider

Each case is derandomized by its number (DNNFUSION_MUTATION_SEED shifts the sequence).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tflite_tools import cli

CASES = int(os.environ.get("DNNFUSION_MUTATION_CASES", "8"))
SEED = int(os.environ.get("DNNFUSION_MUTATION_SEED", "0"))
MODEL, OTHER = "depthwise_residual", "conv_relu6"


def _library(out: Path) -> Path:
    return next(out.glob("lib*_dnnfusion.so"))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, model_path_module):
    """A compile cache and a fuse output of MODEL (and of OTHER, for swaps), built once."""
    root = tmp_path_factory.mktemp("mutation")
    cache = root / "cache"
    env = {**os.environ, "DNNFUSION_CACHE_DIR": str(cache)}
    for stem in (MODEL, OTHER):
        _tool(env, "fuse", str(model_path_module(stem)), "-o", str(root / stem), expect=(0,))
    return root, cache


@pytest.fixture(scope="module")
def model_path_module():
    return lambda stem: Path(__file__).parent / "models" / f"{stem}.tflite"


def _tool(env: dict, *args: str, expect=(0, 2)) -> subprocess.CompletedProcess:
    """Runs the CLI in a process of its own (a crash must not take the test run with it) and
    checks the outcome: an expected exit code, no signal, no traceback, one error line at most."""
    proc = subprocess.run([sys.executable, "-m", "tflite_tools", *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {args}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode in expect, f"exit {proc.returncode} for {args}\n{proc.stdout}\n{proc.stderr[-2000:]}"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tflite_tools: error:")]
    assert len(errors) <= 1, proc.stderr
    return proc


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def mutate(rng: random.Random, files: list[Path], others: list[Path]) -> str:
    """Damages one file (or swaps two) and says what it did."""
    target = rng.choice(files)
    data = target.read_bytes()
    kind = rng.choice(["truncate", "garbage", "zero", "append", "delete", "swap", "foreign"])
    if kind == "truncate":
        target.write_bytes(data[:rng.randrange(len(data) + 1)])
    elif kind == "garbage" and data:
        raw = bytearray(data)
        start = rng.randrange(len(raw))
        for k in range(start, min(len(raw), start + rng.choice([1, 4, 64, 4096]))):
            raw[k] = rng.randrange(256)
        target.write_bytes(bytes(raw))
    elif kind == "zero":
        target.write_bytes(bytes(len(data)))
    elif kind == "append":
        target.write_bytes(data + bytes(rng.randrange(256) for _ in range(rng.choice([1, 17, 1000]))))
    elif kind == "delete":
        target.unlink()
    elif kind == "swap":
        other = rng.choice(files)
        other_data = other.read_bytes()
        other.write_bytes(data)
        target.write_bytes(other_data)
        return f"swap {target.name} <-> {other.name}"
    elif kind == "foreign" and others:
        same_name = [o for o in others if o.name == target.name or o.suffix == target.suffix]
        source = rng.choice(same_name or others)
        target.write_bytes(source.read_bytes())
        return f"{target.name} replaced by {source.parent.name}/{source.name}"
    return f"{kind} {target.relative_to(target.parents[1])}"


@pytest.mark.parametrize("case", range(CASES))
def test_damaged_fuse_output_never_gives_a_wrong_answer(pristine, tmp_path, case):
    root, cache = pristine
    out = tmp_path / "out"
    shutil.copytree(root / MODEL, out)
    rng = random.Random(f"out-{SEED}-{case}")
    what = mutate(rng, _files(out), _files(root / OTHER))
    env = {**os.environ, "DNNFUSION_CACHE_DIR": str(cache)}
    model = out / "model.fused.tflite"
    library = next(iter(sorted(out.glob("lib*.so"))), out / f"lib{MODEL}_dnnfusion.so")
    for claim in ("all", "profitable"):
        _tool(env, "run", str(model), "--delegate", str(library), "--compare", "--option", f"claim={claim}")
    # fuse into the damaged folder: replaced whole (all its files are fuse's own) or refused.
    proc = _tool(env, "fuse", str(_model_source()), "-o", str(out))
    assert proc.returncode == 0 or "fuse did not write" in proc.stderr, what


def _model_source() -> Path:
    return Path(__file__).parent / "models" / f"{MODEL}.tflite"


@pytest.mark.parametrize("case", range(CASES))
def test_damaged_cache_is_rebuilt_or_refused(pristine, tmp_path, case):
    root, pristine_cache = pristine
    cache = tmp_path / "cache"
    shutil.copytree(pristine_cache, cache)
    rng = random.Random(f"cache-{SEED}-{case}")
    entries = [p for p in _files(cache / "kernels") if not p.name.startswith(".")]
    mutate(rng, entries, [])
    env = {**os.environ, "DNNFUSION_CACHE_DIR": str(cache)}
    out = tmp_path / "out"
    proc = _tool(env, "fuse", str(_model_source()), "-o", str(out))
    if proc.returncode == 0:
        _tool(env, "run", str(out / "model.fused.tflite"), "--delegate", str(_library(out)), "--compare",
              "--option", "claim=all", expect=(0,))
