"""The package as users install it: a source distribution of the checkout holds the sources and none
of the build or bench outputs; the wheel pip builds from it carries the delegate runtime's sources and
the license, and, installed in a clean venv, runs the README's main job (fuse the bundled U-Net, run
it with its delegate and compare with LiteRT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import MODELS, REPO

pytestmark = pytest.mark.network  # the build backend and the dependencies come from the package index


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """The checkout's source distribution, as `python -m build --sdist` makes it (in a venv of its own)."""
    work = tmp_path_factory.mktemp("sdist")
    tools = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True, timeout=300)
    subprocess.run([str(tools / "bin" / "pip"), "install", "-q", "build"], check=True, timeout=600)
    subprocess.run([str(tools / "bin" / "python"), "-m", "build", "--sdist", "-o", str(work / "out"), str(REPO)],
                   check=True, timeout=600, capture_output=True)
    return next((work / "out").glob("dnnfusion-*.tar.gz"))


@pytest.fixture(scope="module")
def wheel(sdist, tmp_path_factory) -> Path:
    """The wheel pip builds from the source distribution, as an install from it would."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(sdist), "--no-deps", "-q", "-w", str(out)],
                   check=True, timeout=600)
    return next(out.glob("dnnfusion-*.whl"))


def test_the_source_distribution_holds_the_sources_and_no_outputs(sdist):
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    assert {"pyproject.toml", "CMakeLists.txt", "LICENSE", "README.md", "delegate/src/plugin.cc",
            "delegate/include/dnnfusion/bundle_abi.h", "halide_gen/bundle.py", "tflite_tools/cli.py",
            "tests/models/make_models.py"} <= names
    # Build outputs, caches and the bench corpora (gigabytes, converted offline) stay out; so do the
    # test models (pyproject's sdist.exclude), which tests/models/make_models.py makes again.
    outputs = (".venv/", "build/", "bench/corpus/", "bench/corpus-")
    assert not [n for n in names if n.startswith(outputs) or "__pycache__" in n]


def test_the_wheel_carries_the_runtime_sources_inside_the_package_and_the_license(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tflite_tools", "fusion", "halide_gen", next(t for t in tops if t.endswith(".dist-info"))}
    assert {"halide_gen/delegate/src/plugin.cc", "halide_gen/delegate/exports.map",
            "halide_gen/delegate/android/DnnFusionDelegate.java"} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_wheel_in_a_clean_venv_runs_the_readme_main_job(wheel, tmp_path):
    # A venv of its own (not the checkout's, nothing editable): the wheel and its dependencies from
    # the package index, then the README's first command's job, run outside the checkout.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / "bin"
    subprocess.run([str(bin_dir / "pip"), "install", "-q", str(wheel)], check=True, timeout=900)
    where = subprocess.run([str(bin_dir / "python"), "-c", "import halide_gen.bundle as b; print(b.DELEGATE_DIR)"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv))  # the runtime's sources come from the installed package
    out = tmp_path / "out"
    as_users_run_it = {k: v for k, v in os.environ.items() if k != "DNNFUSION_TARGET"}  # the host multitarget
    fuse = subprocess.run([str(bin_dir / "tflite_tools"), "fuse", str(MODELS / "unet_tiny.tflite"), "-o", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900, env=as_users_run_it)
    assert fuse.returncode == 0, fuse.stderr
    done = subprocess.run([str(bin_dir / "tflite_tools"), "run", str(out / "model.fused.tflite"), "--delegate",
                           str(out / "libunet_tiny_dnnfusion.so"), "--compare"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "declined 0" in done.stdout and " ok" in done.stdout
    assert json.loads((out / "plan.json").read_text())["target"] == "host"
