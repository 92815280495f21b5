"""The real-GPU check (bench/gpu_device/) prepared and run here, on PoCL and lavapipe: the folder it
makes must run with nothing but its own files, and every delegate cell must match LiteRT's reference
outputs, so that the one run a lent GPU machine gets measures speed and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "gpu_device"))

import gpu_counts  # noqa: E402
import prepare  # noqa: E402


def cpu_devices_env() -> dict[str, str]:
    """PoCL for OpenCL and lavapipe for Vulkan (skips where either is not installed)."""
    try:
        opencl, vulkan = gpu_counts.device_env("opencl"), gpu_counts.device_env("vulkan")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return {**opencl, "VK_DRIVER_FILES": vulkan["VK_ICD_FILENAMES"], "VK_ICD_FILENAMES": vulkan["VK_ICD_FILENAMES"],
            "HL_OCL_DEVICE_TYPE": "cpu"}


def test_prepared_check_runs_alone_and_every_delegate_cell_matches_litert(tmp_path):
    env = cpu_devices_env()
    folder = tmp_path / "gpucheck"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert prepare.main([str(folder), "--models", "depthwise_residual", "--python", python]) == 0
    assert prepare.folder_bytes(folder) < prepare.LIMIT_BYTES
    assert sorted(p.name for p in folder.iterdir()) == ["check.py", "payload.tar.xz"]
    out = tmp_path / "out"
    out.mkdir()
    # Run from outside the repository, without its PYTHONPATH: the folder must carry what it needs.
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(folder / "check.py"), "--warmup", "1", "--invokes", "3"],
                          cwd=tmp_path, env={**env, "OUT": str(out)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads((out / "gpu_check.json").read_text())
    for contender in ("xnnpack-1", "xnnpack-all", "ours-opencl", "ours-vulkan"):
        cell = row[contender]
        assert "ms" in cell, f"{contender}: {cell}"
        assert cell["max_rel_err"] <= 1e-4, (contender, cell)
    for api in ("opencl", "vulkan"):
        assert row[f"ours-{api}"]["claimed"] > 0 and row[f"ours-{api}"]["declined"] == 0
    # LiteRT's own GPU accelerator (WebGPU on Vulkan) finds no adapter on lavapipe: a failed cell,
    # reported as such, must not stop the others.
    assert "ms" in row["litert-gpu"] or "error" in row["litert-gpu"]
    assert "| depthwise_residual |" in (out / "gpu_check.md").read_text()


def test_prepare_refuses_models_over_what_a_device_call_carries(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(prepare, "fetch_litert", lambda out, python: None)
    monkeypatch.setattr(prepare, "fetch_loaders", lambda out: None)
    monkeypatch.setattr(prepare, "LIMIT_BYTES", 1000)
    assert prepare.main([str(tmp_path / "gpucheck"), "--models", "depthwise_residual"]) == 2
    assert "over the" in capsys.readouterr().err
    assert not (tmp_path / "gpucheck").exists()  # nothing half-made is left behind


def test_prepare_names_a_model_it_cannot_find(tmp_path):
    with pytest.raises(SystemExit, match="no_such_model"):
        prepare.main([str(tmp_path / "gpucheck"), "--models", "no_such_model"])
