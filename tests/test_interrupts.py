"""Ctrl-C at any point of any command: exit code 130 with one line (or 0, where the command was
already done), never a traceback, and nothing partial left behind (fuse's OUT is the old set or
the new one, its staging folder and the cache's build folders gone)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import MODELS, answers_ctrl_c

MODEL = MODELS / "unet_tiny.tflite"
EM_AARCH64 = 183


@pytest.fixture(scope="module")
def android_out(tmp_path_factory) -> Path:
    """An arm64-android fuse output whose libraries are built (a host build relabelled aarch64: aar
    reads the ELF header and packs the bytes, which is all an interrupted aar needs)."""
    from tflite_tools.fuse import fuse

    work = tmp_path_factory.mktemp("android")
    model = MODELS / "add_relu.tflite"
    library = fuse(model, work / "host", cache_dir=work / "cache").library.read_bytes()
    out = work / "out"
    fuse(model, out, target="arm64-android", cache_dir=work / "cache")
    built = out / "android" / "arm64-v8a" / "build" / "libadd_relu_dnnfusion.so"
    built.parent.mkdir(parents=True)
    built.write_bytes(library[:18] + EM_AARCH64.to_bytes(2, "little") + library[20:])
    (built.parent / "libdnnfusion_jni.so").write_bytes(built.read_bytes())  # its JNI library, as the build makes it
    return out


def _commands(tmp_path: Path, android_out: Path) -> dict[str, list[str]]:
    return {
        "aar": ["aar", str(android_out), "-o", str(tmp_path / "out.aar")],
        "info": ["info", str(MODEL)],
        "fuse": ["fuse", str(MODEL), "-o", str(tmp_path / "out")],
        "run": ["run", str(MODEL), "--compare"],
        "bench": ["bench", str(MODEL), "--runs", "100000"],
        "bench --threads 2": ["bench", str(MODEL), "--threads", "2", "--runs", "100000"],
    }


@pytest.mark.parametrize("after", [0.3, 1.2, 3.0])
@pytest.mark.parametrize("command", ["info", "fuse", "run", "bench", "bench --threads 2", "aar"])
def test_ctrl_c_at_any_point_ends_a_command_cleanly(command, after, tmp_path, android_out):
    env = {**os.environ, "DNNFUSION_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "tflite_tools", *_commands(tmp_path, android_out)[command]], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=answers_ctrl_c)
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
    leftovers = [p for p in tmp_path.rglob(".*") if p.name.startswith(".tmp-") or p.suffix == ".tmp"]
    assert leftovers == [], leftovers
    out = tmp_path / "out"
    if out.exists():  # all or nothing: a complete fuse output
        assert (out / "model.fused.tflite").exists() and (out / "plan.json").exists()
    aar = tmp_path / "out.aar"
    assert not aar.exists() or zipfile.ZipFile(aar).testzip() is None  # all or nothing


# A Ctrl-C inside a native module's initialisation, made certain: a stand-in for LiteRT's module,
# found first on the path, is interrupted as pybind11 reports it, or in code it evaluates.
NATIVE_INTERRUPTS = {
    "wrapped by pybind11": "raise ImportError('initialization failed') from KeyboardInterrupt()\n",
    "in evaluated code": ("import ctypes\n"
                          "run = ctypes.pythonapi.PyRun_String\n"
                          "run.restype, run.argtypes = ctypes.py_object, "
                          "[ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]\n"
                          "run(b'raise KeyboardInterrupt', 257, {}, {})\n"),
}


@pytest.mark.parametrize("how", list(NATIVE_INTERRUPTS))
@pytest.mark.parametrize("entry", ["-m", "-c"])
def test_ctrl_c_as_a_native_module_initialises_is_an_interrupt(how, entry, tmp_path):
    # Not a missing runtime (exit 1), and not the end of the process by SIGINT once the command has
    # returned 130 (`python -m` does that after a KeyboardInterrupt passed through PyRun_String).
    package = tmp_path / "ai_edge_litert"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "interpreter.py").write_text(NATIVE_INTERRUPTS[how])
    command = (["-m", "tflite_tools"] if entry == "-m" else
               ["-c", "import sys; from tflite_tools.console import main; sys.exit(main())"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, *command, "info", str(MODEL)], capture_output=True, text=True,
                          timeout=120, env=env, preexec_fn=answers_ctrl_c)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines() == ["tflite_tools: interrupted"], proc.stderr


def test_ctrl_c_as_a_finished_command_exits_changes_nothing():
    # A command done at the moment of a Ctrl-C: Python gives SIGINT its default action back as it
    # tears down, so the signal ended the process (status -2, a second after `info` started) or
    # raised in an exit handler. Once the status is decided, SIGINT is ignored.
    script = ("import atexit, os, signal, sys\n"
              "atexit.register(os.kill, os.getpid(), signal.SIGINT)\n"
              "from tflite_tools.console import main\n"
              "sys.argv = ['tflite_tools', '--version']\n"
              "sys.exit(main())\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          preexec_fn=answers_ctrl_c)
    assert proc.returncode == 0 and "KeyboardInterrupt" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("tty", [False, True])
def test_each_progress_line_is_written_whole(tty, monkeypatch):
    # A progress line and its end in separate writes let a Ctrl-C between them put the command's
    # "interrupted" on the progress line ("[3850/200010] turn 193tflite_tools: interrupted").
    from tflite_tools import cli

    class Stderr:
        writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return tty

    stderr = Stderr()
    monkeypatch.setattr(sys, "stderr", stderr)
    show = cli._progress_printer()
    show(1, 3, "turn 1")
    show(3, 3, "turn 2")
    assert len(stderr.writes) == 2
    if tty:
        assert stderr.writes == ["\r\033[K[1/3] turn 1", "\r\033[K[3/3] turn 2\n"]
    else:
        assert stderr.writes == ["[1/3] turn 1\n", "[3/3] turn 2\n"]
