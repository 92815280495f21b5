"""Ctrl-C at any point of any command: exit code 130 with one line (or 0, where the command was
already done), never a traceback, and nothing partial left behind (fuse's OUT is the old set or
the new one, its staging folder and the cache's build folders gone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import MODELS

MODEL = MODELS / "unet_tiny.tflite"


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "info": ["info", str(MODEL)],
        "fuse": ["fuse", str(MODEL), "-o", str(tmp_path / "out")],
        "run": ["run", str(MODEL), "--compare"],
        "bench": ["bench", str(MODEL), "--runs", "100000"],
        "bench --threads 2": ["bench", str(MODEL), "--threads", "2", "--runs", "100000"],
    }


@pytest.mark.parametrize("after", [0.3, 1.2, 3.0])
@pytest.mark.parametrize("command", ["info", "fuse", "run", "bench", "bench --threads 2"])
def test_ctrl_c_at_any_point_ends_a_command_cleanly(command, after, tmp_path):
    env = {**os.environ, "DNNFUSION_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "tflite_tools", *_commands(tmp_path)[command]], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(after)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it: to the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1] == "tflite_tools: interrupted"
    leftovers = [p for p in tmp_path.rglob(".tmp-*")]
    assert leftovers == [], leftovers
    out = tmp_path / "out"
    if out.exists():  # all or nothing: a complete fuse output
        assert (out / "model.fused.tflite").exists() and (out / "plan.json").exists()
