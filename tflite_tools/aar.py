"""`tflite_tools aar OUT [OUT ...] -o models.aar`: an Android library (AAR) a Gradle app depends on.

    package_aar([Path("out-cpu"), Path("out-opencl"), Path("other-model")], Path("models_dnnfusion.aar"))

Each OUT is a `fuse --target arm64-android*` folder whose libraries have been built (by fuse with
$ANDROID_NDK set, or with the NDK from OUT/android/arm64-v8a/, docs/android.md). Any number of models
and builds (CPU, OpenCL, Vulkan) go into one AAR side by side — their libraries are named by model and
target — with one copy of the Java class and of the JNI library every model library is reached
through. (Two AARs would each carry them: a duplicate class, and the app's build fails.) The AAR holds

    AndroidManifest.xml        minSdk, and libOpenCL.so as an optional native library for OpenCL builds
    classes.jar                org.dnnfusion.DnnFusionDelegate (and its Options), compiled here with javac
    jni/arm64-v8a/lib*.so      the delegate libraries, and libdnnfusion_jni.so
    proguard.txt               consumer rules: keep what JNI binds by name
    R.txt                      empty: no resources

The fused models are not inside: ship each OUT/model.fused.tflite as the app ships any model (assets/).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

from halide_gen.bundle import DELEGATE_DIR, JNI_LIBRARY
from halide_gen.targets import ANDROID_MIN_SDK, target_spec

from .model.atomic import write_bytes_atomic
from .model.errors import ModelError, ToolchainError
from .sharedlib import check_delegate_library

ABI = "arm64-v8a"
JAVA_SOURCE = DELEGATE_DIR / "android" / "DnnFusionDelegate.java"

# The one TFLite type DnnFusionDelegate.java names. classes.jar must not carry TFLite's own
# classes (the app gets them from its TFLite / LiteRT dependency), so javac compiles against
# this declaration and only org/dnnfusion/ goes into the jar; the class file refers to the
# interface by name, which is what TFLite's real one resolves.
TFLITE_DELEGATE_STUB = """package org.tensorflow.lite;

public interface Delegate {
  long getNativeHandle();
}
"""

CONSUMER_RULES = """\
# dnnfusion: the JNI library binds DnnFusionDelegate's native methods by class and method name.
-keep class org.dnnfusion.DnnFusionDelegate {
    native <methods>;
}
"""


def package_aar(outs: Sequence[Path], aar: Path) -> Path:
    """Writes `aar` (atomically) from fuse output folders of Android builds, of one model or several;
    ModelError when a folder is not one, its libraries are not built yet, or two folders hold
    libraries of one name; ToolchainError without javac."""
    libraries: list[Path] = []
    apis: set[str] = set()
    models: set[str] = set()
    for out in map(Path, outs):
        library, api, model = _built_library(out)
        if any(lib.name == library.name for lib in libraries):
            raise ModelError(f"{out}: a second {library.name}; each build of a model has its own target")
        libraries.append(library)
        apis.update({api} if api else set())
        models.add(model)
    # The package names the AAR: the model's, or the file's when it holds several models.
    name = next(iter(models)) if len(models) == 1 else Path(aar).stem
    entries = {
        "AndroidManifest.xml": manifest(name, apis).encode(),
        "classes.jar": _classes_jar(),
        "proguard.txt": CONSUMER_RULES.encode(),
        "R.txt": b"",
        f"jni/{ABI}/{JNI_LIBRARY}": (libraries[0].parent / JNI_LIBRARY).read_bytes(),
        **{f"jni/{ABI}/{lib.name}": lib.read_bytes() for lib in libraries},
    }
    write_bytes_atomic(Path(aar), _zip(entries))
    return Path(aar)


def manifest(model: str, gpu_apis: set[str]) -> str:
    """The AAR's AndroidManifest.xml. OpenCL is not part of Android: apps targeting Android 12+
    must declare the vendor's libOpenCL.so to load it, optional so that devices without it still
    install the app (the delegate then declines its blocks and TFLite runs the model)."""
    package = "org.dnnfusion." + (re.sub(r"[^0-9a-z_]", "_", model.lower()) or "model")
    native = ('\n    <uses-native-library android:name="libOpenCL.so" android:required="false" />'
              if "opencl" in gpu_apis else "")
    return (f'<?xml version="1.0" encoding="utf-8"?>\n'
            f'<manifest xmlns:android="http://schemas.android.com/apk/res/android" package="{package}">\n'
            f'  <uses-sdk android:minSdkVersion="{ANDROID_MIN_SDK}" />\n'
            f'  <application>{native}\n  </application>\n'
            f'</manifest>\n')


def _built_library(out: Path) -> tuple[Path, str | None, str]:
    """The built library of one fuse output folder, its GPU API (None for the CPU) and the model."""
    try:
        plan = json.loads((out / "plan.json").read_text())
        if not isinstance(plan, dict) or not all(isinstance(plan.get(key), str) for key in ("target", "model")):
            raise ValueError("plan.json names no target or model")
        spec = target_spec(plan["target"])
    except (OSError, ValueError) as exc:
        raise ModelError(f"{out}: not a `tflite_tools fuse` output folder ({exc})") from None
    if spec.packaging != "android-cmake":
        raise ModelError(f"{out}: built for {spec.name}; an AAR takes the arm64-android* targets")
    if not isinstance(plan.get("android_project"), str):
        raise ModelError(f"{out}: not a `tflite_tools fuse` output folder (plan.json names no android_project)")
    project = out / plan["android_project"]
    # Where fuse leaves it (with $ANDROID_NDK), or where docs/android.md's cmake commands build it.
    built = sorted(project.glob("lib*_dnnfusion*.so")) or sorted((project / "build").glob("lib*_dnnfusion*.so"))
    if not built:
        raise ModelError(f"{out}: the library is not built yet; build {project} with the NDK "
                         "(docs/android.md), or fuse with $ANDROID_NDK set")
    check_delegate_library(built[0], machine="aarch64")  # not an x86-64 build, a 0-byte or cut-off file
    if not (built[0].parent / JNI_LIBRARY).is_file():
        raise ModelError(f"{out}: {built[0].name} has no {JNI_LIBRARY} beside it; build {project} again "
                         "(docs/android.md)")
    return built[0], spec.gpu_api, Path(plan["model"]).stem


def _classes_jar() -> bytes:
    """DnnFusionDelegate compiled to Java 8 bytecode (what D8 takes from every Android build)."""
    javac = shutil.which("javac")
    if javac is None:
        raise ToolchainError("javac not found: an AAR needs a JDK (apt-get install default-jdk-headless)")
    with tempfile.TemporaryDirectory(prefix="dnnfusion-aar-") as tmp:
        stub = Path(tmp) / "stub" / "org" / "tensorflow" / "lite" / "Delegate.java"
        stub.parent.mkdir(parents=True)
        stub.write_text(TFLITE_DELEGATE_STUB)
        classes = Path(tmp) / "classes"
        proc = subprocess.run([javac, "--release", "8", "-Xlint:-options", "-d", str(classes), str(JAVA_SOURCE),
                               str(stub)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolchainError(f"javac failed on {JAVA_SOURCE.name}:\n{proc.stderr[-2000:]}")
        ours = sorted((classes / "org" / "dnnfusion").glob("*.class"))  # the class and its Options
        return _zip({f"org/dnnfusion/{c.name}": c.read_bytes() for c in ours})


def _zip(entries: dict[str, bytes]) -> bytes:
    """A zip archive of `entries`, with fixed timestamps: the same inputs give the same bytes."""
    with tempfile.SpooledTemporaryFile() as buffer:
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(entries):
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, entries[name])
        buffer.seek(0)
        return buffer.read()
