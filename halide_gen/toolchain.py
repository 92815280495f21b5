"""The C++ toolchain of a target on this machine: which compiler and archiver build its code, and how
they are run (a clear, one-line error when one is missing or fails)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tflite_tools.model.errors import ToolchainError

from .targets import target_spec


def compiler_for(target: str) -> str:
    """The C++ compiler that builds a delegate library for `target` (a clear error if missing): the
    one its toolchain names (halide_gen.targets.TOOLCHAINS), never a guess."""
    try:
        toolchain = target_spec(target).toolchain
    except ValueError as exc:
        raise ToolchainError(str(exc)) from None
    compiler = os.environ.get(toolchain.compiler_env) or toolchain.compiler
    if shutil.which(compiler) is None:
        raise ToolchainError(f"{compiler} not found (apt-get install {toolchain.package}, or name one in "
                             f"{toolchain.compiler_env})")
    return compiler


def archiver_for(compiler: str) -> str:
    """The archiver that goes with a compiler (its own `ar`, so a cross toolchain's reads its objects)."""
    return subprocess.run([compiler, "-print-prog-name=ar"], capture_output=True, text=True).stdout.strip() or "ar"


def run_tool(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    """Runs a compiler or archiver; ToolchainError with its last words when it fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    except OSError as exc:
        raise ToolchainError(f"{what}: cannot run {cmd[0]}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        last = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        raise ToolchainError(f"{what} failed ({cmd[0]} exit {proc.returncode}): "
                             f"{last[-1] if last else 'no message'}")
