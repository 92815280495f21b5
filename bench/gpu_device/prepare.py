"""Prepares the GPU delegate check for a machine with a real GPU and no network: fuses each model for
`host-opencl` and `host-vulkan`, saves LiteRT's reference outputs, and packs what such a machine lacks —
the parts of the ai-edge-litert wheel that run a model (its interpreter and LiteRT's own GPU accelerator),
Debian's OpenCL ICD loader, and the Vulkan loader with the GL dispatch libraries NVIDIA's Vulkan driver
loads — all in one payload.tar.xz (xz: the models' float weights shrink by about an eighth, the libraries
by two thirds). check.py (copied in beside it) runs there with nothing but Python and numpy (3.12 by
default: `--python` names another).

    python bench/gpu_device/prepare.py .gpucheck                       # test models, mobilenet_v3_small, mobilenet_v2
    python bench/gpu_device/prepare.py .gpucheck-bert --models bert_small
    # there, with the folder carried (.gpucheck* is git-ignored); results also land in $OUT when it is set:
    python3 .gpucheck/check.py

A folder must fit the device tool's 64 MiB (the working tree and every carried path together): one
that does not is deleted with a clear error, and bert_small's 44 MB of weights go in a folder of their
own. Each model is fused once per API; the rewritten .tflite is the same for both
(the plan does not depend on the GPU API) and is stored once.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

TEST_MODELS = ["unet_tiny", "transformer_encoder", "depthwise_residual"]
DEFAULT_MODELS = [*TEST_MODELS, "mobilenet_v3_small", "mobilenet_v2"]
APIS = ["opencl", "vulkan"]
LIMIT_BYTES = 58 * 2**20  # the device tool's 64 MiB, less the repository's own files (about 6 MiB)
LITERT = "ai-edge-litert==2.3.0"
# Parts of the wheel a model run needs none of: the NPU compiler plugins and the AOT / model tools.
LITERT_UNNEEDED = ("ai_edge_litert/tools/", "ai_edge_litert/vendors/", "ai_edge_litert/aot/")
GL_PACKAGES = ["libvulkan1", "libglvnd0", "libglx0", "libegl1", "libgl1", "libopengl0", "libgles2"]


def model_path(name: str) -> Path:
    """A test model by stem, a reference model by stem (bench/zoo.py's set), or a .tflite path."""
    import zoo

    if name.endswith(".tflite"):
        return Path(name)
    test = REPO / "tests" / "models" / f"{name}.tflite"
    if test.exists():
        return test
    try:
        reference = zoo.reference_models(REPO / "bench" / "zoo")
    except FileNotFoundError as exc:
        raise SystemExit(f"error: {name} is not a test model, and {exc}") from None
    for path in reference:
        if path.stem == name:
            return path
    raise SystemExit(f"error: no model named {name}: not in tests/models nor in the reference set (bench/zoo.py)")


def fetch_litert(out: Path, python: str) -> None:
    """out/litert: the manylinux wheel for CPython `python` ("3.12") without the parts a model run does
    not import (the wheel is native code: it loads only in the Python it was built for)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--python-version", python, "--implementation", "cp", "--platform", "manylinux_2_27_x86_64",
                        "--platform", "manylinux_2_17_x86_64", "-d", tmp, LITERT], check=True)
        wheel = next(Path(tmp).glob("ai_edge_litert-*.whl"))
        with zipfile.ZipFile(wheel) as src:
            src.extractall(out / "litert", [name for name in src.namelist() if name.startswith("ai_edge_litert/")
                                            and not name.startswith(LITERT_UNNEEDED)])


def fetch_loaders(out: Path) -> None:
    """Debian's OpenCL ICD loader into out/ocl, and the Vulkan loader and GL dispatch libraries into
    out/gl (unpacked: check.py puts them on LD_LIBRARY_PATH instead of installing them into /)."""
    for folder, packages in (("ocl", ["ocl-icd-libopencl1"]), ("gl", GL_PACKAGES)):
        with tempfile.TemporaryDirectory() as tmp:
            got = subprocess.run(["apt-get", "download", *packages], cwd=tmp, capture_output=True, text=True)
            if got.returncode != 0:  # most often package lists never fetched on this machine
                raise SystemExit(f"error: apt-get download {' '.join(packages)} failed (apt-get update first?): "
                                 f"{got.stderr.strip()[-500:]}")
            for deb in Path(tmp).glob("*.deb"):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(out / folder)], check=True)
        for docs in (out / folder / "usr" / "share").glob("*"):
            shutil.rmtree(docs)


def save_model(out: Path, path: Path) -> None:
    """Fuses one model for each API into out/<stem>/ (model.fused.tflite once, <api>/lib*.so) with its
    inputs and LiteRT's outputs from the kernels tflite_tools.run.reference_resolver names (the
    reference kernels, or what stock LiteRT runs where those cannot)."""
    import numpy as np

    from tflite_tools import runtime
    from tflite_tools.fuse import fuse
    from tflite_tools.run import reference_resolver

    folder = out / path.stem
    for api in APIS:
        with tempfile.TemporaryDirectory() as tmp:
            result = fuse(path, Path(tmp) / "out", target=f"host-{api}")
            shared = folder / "model.fused.tflite"
            (folder / api).mkdir(parents=True, exist_ok=True)
            if not shared.exists():
                shutil.copy2(result.model, shared)
            elif shared.read_bytes() != result.model.read_bytes():
                shutil.copy2(result.model, folder / api / "model.fused.tflite")
            shutil.copy2(result.library, folder / api / result.library.name)
    ref = runtime.make_interpreter(shared, reference_resolver(shared))
    inputs = runtime.random_inputs(ref, seed=7)
    for k, x in enumerate(inputs):
        np.save(folder / f"in{k}.npy", x)
    for k, y in enumerate(runtime.run(ref, inputs)):
        np.save(folder / f"ref{k}.npy", y)


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    """Writes the output folder: payload.tar.xz (fused models, references, runtime, loaders) and check.py."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, nargs="?", default=REPO / ".gpucheck")
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS,
                        help="test or reference model stems, or .tflite paths")
    parser.add_argument("--python", default="3.12",
                        help="the device machine's python3 version, for the LiteRT wheel (default 3.12)")
    args = parser.parse_args(argv)
    paths = [model_path(name) for name in args.models]
    if args.out.exists():
        shutil.rmtree(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        fetch_litert(staging, args.python)
        fetch_loaders(staging)
        for path in paths:
            save_model(staging, path)
        args.out.mkdir(parents=True)
        with tarfile.open(args.out / "payload.tar.xz", "w:xz") as payload:
            for item in sorted(staging.iterdir()):
                payload.add(item, arcname=item.name)
    shutil.copy2(Path(__file__).with_name("check.py"), args.out / "check.py")
    size = folder_bytes(args.out)
    if size > LIMIT_BYTES:
        shutil.rmtree(args.out)
        print(f"error: {', '.join(p.stem for p in paths)} and the runtime pack to {size / 2**20:.1f} MiB, over the "
              f"{LIMIT_BYTES / 2**20:.0f} MiB a device call carries: prepare them in separate folders",
              file=sys.stderr)
        return 2
    print(f"{args.out}: {len(paths)} models, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
