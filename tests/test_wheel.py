"""The package as users install it: a wheel built from the checkout carries the delegate runtime's
sources and the license, and, installed outside the checkout, fuses a model and runs it with the
delegate it built."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from conftest import MODELS, REPO

pytestmark = pytest.mark.network  # the build backend is fetched into an isolated build environment


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(out)],
                   check=True, timeout=600)
    return next(out.glob("dnnfusion-*.whl"))


def test_the_wheel_carries_the_runtime_sources_inside_the_package_and_the_license(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tflite_tools", "fusion", "halide_gen", next(t for t in tops if t.endswith(".dist-info"))}
    assert {"halide_gen/delegate/src/plugin.cc", "halide_gen/delegate/exports.map",
            "halide_gen/delegate/android/DnnFusionDelegate.java"} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_installed_wheel_fuses_and_runs_a_model_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=300)
    # -S: no site-packages processing, so the checkout's editable install cannot answer the imports;
    # the dependencies come from this interpreter's site-packages, after the installed wheel.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), sysconfig.get_paths()["purelib"],
                                                         sysconfig.get_paths()["platlib"]])}
    script = (
        "import sys, halide_gen.bundle as b, tflite_tools.cli as cli\n"
        "assert str(b.DELEGATE_DIR).startswith(sys.argv[1]), b.DELEGATE_DIR\n"
        "out = sys.argv[2]\n"
        "assert cli.main(['fuse', sys.argv[3], '-o', out]) == 0\n"
        "sys.exit(cli.main(['run', out + '/model.fused.tflite', '--delegate', out + '/libadd_relu_dnnfusion.so',"
        " '--compare']))\n")
    done = subprocess.run([sys.executable, "-S", "-c", script, str(site), str(tmp_path / "out"),
                           str(MODELS / "add_relu.tflite")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "claimed 1 blocks" in done.stdout and " ok" in done.stdout
