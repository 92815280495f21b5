"""Shared fixtures: where the project's test models and (optionally) the reference models live."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MODELS = TESTS / "models"
# The emulated aarch64 Python (arm64_rootfs) and the bench scripts some tests check live in bench/.
sys.path.insert(0, str(REPO / "bench"))

# What the tests fuse without naming a target is built for this CPU alone (a fifth of the host
# multitarget's compile time); tests of the multitarget library name "host" (test_aot, test_wheel).
os.environ.setdefault("DNNFUSION_TARGET", "host-native")

# Models LiteRT cannot run as they are (they exist to be loaded and flagged, not invoked).
NOT_RUNNABLE = {"custom_op"}


def project_model_paths() -> list[Path]:
    """Every .tflite the project ships for its tests."""
    return sorted(MODELS.glob("*.tflite"))


def shared_model_paths() -> list[Path]:
    """The reference models in ../shared/models (or $DNNFUSION_SHARED_MODELS) when present.

    Tests never need them; where they exist, extra cases run on them too.
    """
    folder = Path(os.environ.get("DNNFUSION_SHARED_MODELS", REPO.parent / "shared" / "models"))
    return sorted(folder.glob("*.tflite")) if folder.is_dir() else []


def corpus_model_paths() -> list[Path]:
    """The converter corpus (bench/corpus.py build / build-torch) when $DNNFUSION_CORPUS names its
    folder: opt-in, as fusing 25 architectures takes most of an hour."""
    folder = os.environ.get("DNNFUSION_CORPUS")
    return sorted(Path(folder).glob("*.tflite")) if folder and Path(folder).is_dir() else []


def answers_ctrl_c() -> None:
    """A child's SIGINT as a terminal's foreground job has it (Popen's preexec_fn): a test run
    started as a background job of a non-interactive shell ignores SIGINT (POSIX), and an ignored
    SIGINT is inherited across exec, so the command under test would never see the Ctrl-C."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def model_id(path: Path) -> str:
    """A test id: the model's file stem."""
    return path.stem


@pytest.fixture(scope="session")
def cross_tools() -> None:
    """Skips where qemu-user or the aarch64 cross compiler is missing, except in CI, where it fails."""
    import shutil

    if shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-g++") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("qemu-user and g++-aarch64-linux-gnu are required in CI (scripts/install-system-deps.sh)")
        pytest.skip("needs qemu-user and g++-aarch64-linux-gnu")


@pytest.fixture(scope="session")
def pipeline_models() -> None:
    """Skips where LLVM's tools with the ARM pipeline models (bench/arm_cycles.py) are missing, except
    in CI, where it fails."""
    from arm_cycles import Unavailable, llvm_tool

    try:
        llvm_tool("llvm-mca")
        llvm_tool("llvm-mc")
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{exc}: required in CI (scripts/install-system-deps.sh)")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def arm64_root(cross_tools) -> Path:
    """The emulated aarch64 Python with LiteRT (bench/arm64_rootfs.py), cached in the user's dnnfusion
    cache across runs. Skips where qemu-user or the cross compiler is missing, except in CI."""
    from arm64_rootfs import Unavailable, prepare
    from fusion.cost import default_cache_dir

    try:
        return prepare(default_cache_dir())
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))


@pytest.fixture
def model_path():
    """Returns the path of a project test model by stem."""

    def get(stem: str) -> Path:
        path = MODELS / f"{stem}.tflite"
        assert path.exists(), f"missing test model {path}; run tests/models/make_models.py"
        return path

    return get


# What a test needs beyond this machine's CPU and the project's venv, as markers, so that a quick
# run can leave it out: `pytest -m "not slow and not cross and not gpu and not network"`.
#   cross   — the aarch64 cross compiler and qemu-aarch64
#   gpu     — an OpenCL (PoCL) or Vulkan (lavapipe) device
#   network — packages fetched once (an aarch64 rootfs, a tflite-runtime venv), then cached
#   slow    — fuzzers and whole-model runs that take a minute or more
MODULE_MARKS = {
    "test_arm64": ("cross", "network", "slow"),
    "test_arm_count": ("cross", "network"),
    "test_android": ("cross",),
    "test_gpu_delegate": ("gpu", "slow"),
    "test_gpu_device_check": ("gpu", "network"),
    "test_tflite_runtime": ("network", "slow"),
    "test_fuzz_blocks": ("slow",),
    "test_mutation_fuzz": ("slow",),
    "test_delegate": ("slow",),
}


def pytest_collection_modifyitems(items):
    """Marks each test by its module (MODULE_MARKS) and by the compile target it is given."""
    for item in items:
        for mark in MODULE_MARKS.get(item.module.__name__, ()):
            item.add_marker(mark)
        params = getattr(getattr(item, "callspec", None), "params", {})
        target = params.get("target")
        if isinstance(target, str) and target.startswith("arm64"):
            item.add_marker("cross")
        if isinstance(target, str) and ("opencl" in target or "vulkan" in target):
            item.add_marker("gpu")


def _run_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this test run that every worker shares: under pytest-xdist each worker's temporary
    root sits in the run's, and the caches kept there are safe to share (entries appear by rename)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """One compile cache for the run: models share blocks."""
    return _run_folder(tmp_path_factory, "kernels")


# Cache entries that depend on the target alone (the delegate runtime's objects, the Halide runtime):
# seconds to compile each, and the same for every test that fuses for that target.
RUNTIME_ENTRIES = ("delegate-", "runtime-")


@pytest.fixture(scope="session")
def runtime_store(tmp_path_factory):
    """The compiled runtimes the run's private caches share (RUNTIME_ENTRIES)."""
    return _run_folder(tmp_path_factory, "runtimes")


def _copy_runtimes(source: Path, destination: Path) -> None:
    import shutil

    if not source.is_dir():
        return
    destination.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.is_dir() and entry.name.startswith(RUNTIME_ENTRIES) and not (destination / entry.name).exists():
            staged = destination / f".tmp-{os.getpid()}-copy-{entry.name}"
            shutil.copytree(entry, staged)
            try:
                staged.rename(destination / entry.name)
            except OSError:  # another worker copied it first
                shutil.rmtree(staged, ignore_errors=True)


@pytest.fixture
def private_cache(tmp_path, runtime_store):
    """A compile cache of the test's own, as `fuse(cache_dir=...)` takes it (its parent is the
    folder DNNFUSION_CACHE_DIR names for the CLI): no kernel or measurement of another test is in
    it, but the session's compiled runtimes are, and the ones it compiles join them afterwards."""
    cache = tmp_path / "cache" / "kernels"
    _copy_runtimes(runtime_store, cache)
    yield cache
    _copy_runtimes(cache, runtime_store)


@pytest.fixture(scope="session")
def fused(tmp_path_factory, kernel_cache):
    """Fuses a project test model (by stem, or a path) once for the whole test run."""
    from tflite_tools.fuse import FuseResult, fuse

    root = tmp_path_factory.mktemp("fused")
    results: dict[str, FuseResult] = {}

    def get(stem: str | Path) -> FuseResult:
        model = stem if isinstance(stem, Path) else MODELS / f"{stem}.tflite"
        if model.stem not in results:
            results[model.stem] = fuse(model, root / model.stem, cache_dir=kernel_cache)
        return results[model.stem]

    return get
