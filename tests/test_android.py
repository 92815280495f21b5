"""The Android package: `fuse --target arm64-android` writes a self-contained CMake project. No NDK
here, so the same project is built with Debian's aarch64 cross compiler — directly, and through
fuse's $ANDROID_NDK path with a stand-in toolchain file — so it never rots."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import pytest

from conftest import MODELS
from halide_gen.bundle import build_cmake_project
from halide_gen.targets import ANDROID_MIN_SDK
from tflite_tools import cli
from tflite_tools.aar import package_aar
from tflite_tools.fuse import fuse

CROSS = "aarch64-linux-gnu-g++"
CROSS_TOOLCHAIN = f"""set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER {CROSS})
"""


@pytest.fixture
def cross():
    if shutil.which(CROSS) is None or shutil.which("cmake") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CROSS} and cmake are required in CI (scripts/install-system-deps.sh)")
        pytest.skip(f"needs {CROSS} and cmake")


def exported(library) -> set[str]:
    nm = shutil.which("aarch64-linux-gnu-nm") or "nm"
    out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def elf_machine(library) -> int:
    return int.from_bytes(library.read_bytes()[18:20], "little")  # e_machine: 183 = AArch64


def readelf(option: str, library) -> list[str]:
    tool = shutil.which("aarch64-linux-gnu-readelf") or "readelf"
    return subprocess.run([tool, option, str(library)], capture_output=True, text=True, check=True).stdout.splitlines()


def load_segment_alignments(library) -> list[int]:
    return [int(line.split()[-1], 16) for line in readelf("-lW", library) if line.split()[:1] == ["LOAD"]]


def needed(library) -> set[str]:
    return {line.split("[")[1].rstrip("]") for line in readelf("-dW", library) if "(NEEDED)" in line}


def test_android_project_builds_with_the_cross_compiler(cross, tmp_path, monkeypatch, private_cache):
    monkeypatch.delenv("ANDROID_NDK", raising=False)
    result = fuse(MODELS / "depthwise_residual.tflite", tmp_path / "out", target="arm64-android",
                  cache_dir=private_cache)
    project = result.android_project
    assert result.library is None and project == tmp_path / "out" / "android" / "arm64-v8a"
    assert {p.name for p in project.iterdir()} >= {"CMakeLists.txt", "bundle.cc", "kernels", "halide_runtime.o",
                                                  "include", "runtime"}
    assert (project / "runtime" / "android" / "DnnFusionDelegate.java").exists()
    assert json.loads(result.plan_json.read_text())["android_project"] == "android/arm64-v8a"
    toolchain = tmp_path / "aarch64.cmake"
    toolchain.write_text(CROSS_TOOLCHAIN)
    build_cmake_project(project, tmp_path / "build", [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"])
    library = tmp_path / "build" / "libdepthwise_residual_dnnfusion.so"
    assert elf_machine(library) == 183
    assert exported(library) == {"tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"}
    # Google Play takes only 16 KB-aligned native libraries for apps targeting Android 15+.
    assert load_segment_alignments(library) and all(a % 16384 == 0 for a in load_segment_alignments(library))


def test_fuse_builds_with_android_ndk_when_set(cross, tmp_path, monkeypatch, private_cache):
    # A stand-in NDK whose toolchain file points CMake at the Linux cross compiler: the path fuse
    # takes with a real $ANDROID_NDK, end to end.
    ndk = tmp_path / "ndk"
    (ndk / "build" / "cmake").mkdir(parents=True)
    (ndk / "build" / "cmake" / "android.toolchain.cmake").write_text(CROSS_TOOLCHAIN)
    monkeypatch.setenv("ANDROID_NDK", str(ndk))
    result = fuse(MODELS / "fc_softmax.tflite", tmp_path / "out", target="arm64-android", cache_dir=private_cache)
    assert result.library == result.android_project / "libfc_softmax_dnnfusion.so"
    assert elf_machine(result.library) == 183
    assert not (tmp_path / "out" / ".build").exists()


def test_android_ndk_without_toolchain_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDROID_NDK", str(tmp_path / "nowhere"))
    assert cli.main(["fuse", str(MODELS / "add_relu.tflite"), "-o", str(tmp_path / "out"),
                     "--target", "arm64-android"]) == 2
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- the Android-only branch: logcat and the JNI shim ---------------------------------------------

JNI_EXPORTS = {f"Java_org_dnnfusion_DnnFusionDelegate_{m}"
               for m in ("nativeCreate", "nativeDelegate", "nativeLoadProblem", "nativeDestroy")}
PLUGIN_EXPORTS = {"tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"}


@pytest.fixture
def jdk() -> Path:
    """The JDK's bin folder (javac, javap, java): the AAR's classes and jni.h come from it."""
    javac = shutil.which("javac")
    if javac is None:
        if os.environ.get("CI") == "true":
            pytest.fail("a JDK is required in CI (scripts/install-system-deps.sh)")
        pytest.skip("needs javac (a JDK)")
    return Path(javac).resolve().parent


@pytest.fixture
def android_ndk(cross, jdk, tmp_path) -> Path:
    """A stand-in NDK: its android.toolchain.cmake points CMake at Debian's aarch64 cross compiler
    and gives the build what the NDK gives an Android one — ANDROID set, __ANDROID__ defined,
    jni.h (the JDK's) and android/log.h (android-liblog-dev) on the include path, a liblog.so to
    link — so the Android-only branch of the generated CMake project (logcat, the JNI shim) is
    compiled and linked here."""
    log_h = Path("/usr/include/android/android/log.h")
    if not log_h.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("android-liblog-dev is required in CI (scripts/install-system-deps.sh)")
        pytest.skip("needs android-liblog-dev")
    jdk_include = jdk.parent / "include"
    ndk = tmp_path / "ndk"
    (ndk / "lib").mkdir(parents=True)
    (ndk / "log.c").write_text("int __android_log_print(int p, const char* t, const char* f, ...) { return 0; }\n")
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-fPIC", str(ndk / "log.c"), "-o", str(ndk / "lib" / "liblog.so")],
                   check=True)
    (ndk / "build" / "cmake").mkdir(parents=True)
    (ndk / "build" / "cmake" / "android.toolchain.cmake").write_text(CROSS_TOOLCHAIN + f"""set(ANDROID TRUE)
set(CMAKE_CXX_FLAGS_INIT "-D__ANDROID__ -isystem {jdk_include} -isystem {jdk_include / 'linux'} -isystem {log_h.parents[1]}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-L{ndk / 'lib'}")
""")
    return ndk


def native_methods(jdk: Path, classes: Path) -> set[str]:
    """DnnFusionDelegate's native methods, read from its class file with javap."""
    out = subprocess.run([str(jdk / "javap"), "-p", "-cp", str(classes), "org.dnnfusion.DnnFusionDelegate"], capture_output=True,
                         text=True, check=True).stdout
    return {line.split("(")[0].split()[-1] for line in out.splitlines() if " native " in line}


def test_android_build_logs_to_logcat_and_builds_the_one_jni_library(android_ndk, jdk, tmp_path, monkeypatch,
                                                                      private_cache):
    monkeypatch.setenv("ANDROID_NDK", str(android_ndk))
    result = fuse(MODELS / "depthwise_residual.tflite", tmp_path / "out", target="arm64-android",
                  cache_dir=private_cache)
    library = result.library
    assert library.name == "libdepthwise_residual_dnnfusion.so" and elf_machine(library) == 183
    # The model library exports the plugin entry points only: JNI symbols of its own would make a
    # second dnnfusion library in the app bind to the first (ART binds a native method once).
    assert exported(library) == PLUGIN_EXPORTS
    assert "liblog.so" in needed(library)  # Log() writes through __android_log_print
    jni = library.parent / "libdnnfusion_jni.so"
    assert elf_machine(jni) == 183 and exported(jni) == JNI_EXPORTS
    assert all(a % 16384 == 0 for a in load_segment_alignments(library) + load_segment_alignments(jni))
    # Every native method the Java class declares has its JNI symbol, and no symbol lacks one.
    aar = package_aar([tmp_path / "out"], tmp_path / "m.aar")
    with zipfile.ZipFile(aar) as archive:
        (tmp_path / "classes").mkdir()
        with zipfile.ZipFile(io.BytesIO(archive.read("classes.jar"))) as jar:
            jar.extractall(tmp_path / "classes")
    assert {f"Java_org_dnnfusion_DnnFusionDelegate_{m}" for m in native_methods(jdk, tmp_path / "classes")} == JNI_EXPORTS


def test_cpu_and_gpu_builds_ship_side_by_side_in_one_aar(android_ndk, tmp_path, monkeypatch, private_cache):
    monkeypatch.setenv("ANDROID_NDK", str(android_ndk))
    outs = []
    for target in ("arm64-android", "arm64-android-opencl"):
        outs.append(tmp_path / target)
        fuse(MODELS / "add_relu.tflite", outs[-1], target=target, cache_dir=private_cache)
    assert cli.main(["aar", *map(str, outs), "-o", str(tmp_path / "add_relu.aar")]) == 0
    with zipfile.ZipFile(tmp_path / "add_relu.aar") as archive:
        names = set(archive.namelist())
        assert names == {"AndroidManifest.xml", "classes.jar", "proguard.txt", "R.txt", "jni/arm64-v8a/libdnnfusion_jni.so",
                         "jni/arm64-v8a/libadd_relu_dnnfusion.so", "jni/arm64-v8a/libadd_relu_dnnfusion_opencl.so"}
        manifest = ElementTree.fromstring(archive.read("AndroidManifest.xml"))
        rules = archive.read("proguard.txt").decode()
        with zipfile.ZipFile(io.BytesIO(archive.read("classes.jar"))) as jar:
            # None of TFLite's classes.
            assert jar.namelist() == ["org/dnnfusion/DnnFusionDelegate$Options.class",
                                      "org/dnnfusion/DnnFusionDelegate.class"]
    android = "{http://schemas.android.com/apk/res/android}"
    assert manifest.get("package") == "org.dnnfusion.add_relu"
    assert manifest.find("uses-sdk").get(f"{android}minSdkVersion") == str(ANDROID_MIN_SDK)
    (opencl,) = manifest.find("application").findall("uses-native-library")
    assert opencl.get(f"{android}name") == "libOpenCL.so" and opencl.get(f"{android}required") == "false"
    assert "-keep class org.dnnfusion.DnnFusionDelegate" in rules and "native <methods>;" in rules


def test_aar_refuses_what_it_cannot_package(tmp_path, capsys, monkeypatch, private_cache):
    monkeypatch.delenv("ANDROID_NDK", raising=False)
    fuse(MODELS / "add_relu.tflite", tmp_path / "host", cache_dir=private_cache)
    fuse(MODELS / "add_relu.tflite", tmp_path / "android", target="arm64-android", cache_dir=private_cache)
    cases = [(tmp_path / "host", "an AAR takes the arm64-android* targets"),
             (tmp_path / "android", "the library is not built yet"),
             (tmp_path / "nowhere", "not a `tflite_tools fuse` output folder")]
    for k, text in enumerate(['{"target": "arm64-android"}', "[]", "null", '{"target": 3}']):
        (tmp_path / f"plan{k}").mkdir()
        (tmp_path / f"plan{k}" / "plan.json").write_text(text)
        cases.append((tmp_path / f"plan{k}", "not a `tflite_tools fuse` output folder"))
    for out, message in cases:
        code = cli.main(["aar", str(out), "-o", str(tmp_path / "x.aar")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err
    # A library of another machine, an empty one, or one cmake left where docs/android.md builds it.
    library = tmp_path / "android" / "android" / "arm64-v8a" / "build" / "libadd_relu_dnnfusion.so"
    library.parent.mkdir()
    for content, message in [(fuse(MODELS / "add_relu.tflite", tmp_path / "x86", cache_dir=private_cache).library
                              .read_bytes(), "built for EM_X86_64, it must be for aarch64"), (b"", "not an ELF file")]:
        library.write_bytes(content)
        assert cli.main(["aar", str(tmp_path / "android"), "-o", str(tmp_path / "x.aar")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x.aar").exists()


JAVA_PROBE = """import java.util.HashMap;
import org.dnnfusion.DnnFusionDelegate;

public class Probe {
  public static void main(String[] args) {
    System.out.println(DnnFusionDelegate.isSupported("no_such_dnnfusion"));
    System.out.println(DnnFusionDelegate.createOrNull("no_such_dnnfusion", new HashMap<String, String>()) == null);
    try {
      new DnnFusionDelegate("no_such_dnnfusion", new HashMap<String, String>());
      System.out.println("created");
    } catch (UnsatisfiedLinkError e) {
      System.out.println("UnsatisfiedLinkError");
    }
  }
}
"""


def test_java_api_falls_back_where_the_library_is_missing(jdk, tmp_path):
    # On a device whose ABI has no library (or an APK without it) the app asks first and runs
    # without the delegate; run here on the host's JVM against the class the AAR ships.
    from tflite_tools.aar import JAVA_SOURCE, TFLITE_DELEGATE_STUB

    stub = tmp_path / "src" / "org" / "tensorflow" / "lite" / "Delegate.java"
    stub.parent.mkdir(parents=True)
    stub.write_text(TFLITE_DELEGATE_STUB)
    (tmp_path / "src" / "Probe.java").write_text(JAVA_PROBE)
    subprocess.run([str(jdk / "javac"), "-d", str(tmp_path / "classes"), str(JAVA_SOURCE), str(stub),
                    str(tmp_path / "src" / "Probe.java")], check=True)
    out = subprocess.run([str(jdk / "java"), "-cp", str(tmp_path / "classes"), "Probe"], capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["false", "true", "UnsatisfiedLinkError"]


def test_two_models_and_their_builds_share_one_aar(android_ndk, tmp_path, monkeypatch, private_cache):
    # Two models' AARs would each carry the class and the JNI library (a duplicate class: the app's
    # build fails): one AAR holds any number of models, with one copy of each.
    monkeypatch.setenv("ANDROID_NDK", str(android_ndk))
    outs = [tmp_path / "add_relu", tmp_path / "add_relu_opencl", tmp_path / "conv_relu6"]
    fuse(MODELS / "add_relu.tflite", outs[0], target="arm64-android", cache_dir=private_cache)
    fuse(MODELS / "add_relu.tflite", outs[1], target="arm64-android-opencl", cache_dir=private_cache)
    fuse(MODELS / "conv_relu6.tflite", outs[2], target="arm64-android", cache_dir=private_cache)
    aar = package_aar(outs, tmp_path / "vision_models.aar")
    with zipfile.ZipFile(aar) as archive:
        libraries = sorted(n for n in archive.namelist() if n.startswith("jni/"))
        manifest = ElementTree.fromstring(archive.read("AndroidManifest.xml"))
        with zipfile.ZipFile(io.BytesIO(archive.read("classes.jar"))) as jar:
            classes = jar.namelist()
    assert libraries == ["jni/arm64-v8a/libadd_relu_dnnfusion.so", "jni/arm64-v8a/libadd_relu_dnnfusion_opencl.so",
                         "jni/arm64-v8a/libconv_relu6_dnnfusion.so", "jni/arm64-v8a/libdnnfusion_jni.so"]
    assert classes == ["org/dnnfusion/DnnFusionDelegate$Options.class", "org/dnnfusion/DnnFusionDelegate.class"]
    assert manifest.get("package") == "org.dnnfusion.vision_models"


JAVA_TWO_LIBRARIES = """import java.util.Map;
import org.dnnfusion.DnnFusionDelegate;

public class TwoLibraries {
  public static void main(String[] args) throws Exception {
    Map<String, String> options = new DnnFusionDelegate.Options().logLevel("info").claim("all").build();
    DnnFusionDelegate[] delegates = new DnnFusionDelegate[args.length];
    for (int i = 0; i < args.length; ++i) {
      System.out.println(DnnFusionDelegate.isSupported(args[i]));
      System.err.flush();
      delegates[i] = new DnnFusionDelegate(args[i], options);
      System.err.flush();
      System.out.println(delegates[i].getNativeHandle() != 0);
      System.out.println("[" + delegates[i].claimReport() + "]");
    }
    System.out.println(delegates[0].getNativeHandle() != delegates[1].getNativeHandle());
    for (DnnFusionDelegate d : delegates) d.close();
    for (String library : args) System.out.println("[" + DnnFusionDelegate.deviceProblem(library) + "]");
    System.out.println(DnnFusionDelegate.isSupported("no_such_dnnfusion"));
    try {
      new DnnFusionDelegate(args[0], new DnnFusionDelegate.Options().claim("most").build());
    } catch (IllegalArgumentException e) {
      System.out.println("IllegalArgumentException: " + e.getMessage());
    }
  }
}
"""


def _java_classes(jdk: Path, tmp_path: Path, *sources: tuple[str, str]) -> Path:
    """DnnFusionDelegate and the given (class name, source) programs compiled against the Delegate stub."""
    from tflite_tools.aar import JAVA_SOURCE, TFLITE_DELEGATE_STUB

    stub = tmp_path / "src" / "org" / "tensorflow" / "lite" / "Delegate.java"
    stub.parent.mkdir(parents=True)
    stub.write_text(TFLITE_DELEGATE_STUB)
    programs = []
    for name, text in sources:
        programs.append(tmp_path / "src" / f"{name}.java")
        programs[-1].write_text(text)
    subprocess.run([str(jdk / "javac"), "-d", str(tmp_path / "classes"), str(JAVA_SOURCE), str(stub),
                    *map(str, programs)], check=True)
    return tmp_path / "classes"


def test_one_process_loads_two_models_and_a_cpu_and_gpu_pair_each_from_its_own_library(jdk, tmp_path, private_cache):
    # On the host's JVM: the JNI library built for x86-64, three host delegate libraries — two
    # models, and one model's CPU and OpenCL builds — and a delegate created from each. Each says
    # which bundle it loaded as it is created: every one is its own library's. With no OpenCL
    # driver (no ICD), the device check says so for the OpenCL build only.
    from halide_gen.bundle import DELEGATE_DIR

    jni = tmp_path / "jni" / "libdnnfusion_jni.so"
    jni.parent.mkdir()
    include = jdk.parent / "include"
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-O2", f"-I{include}", f"-I{include / 'linux'}",
                    str(DELEGATE_DIR / "android" / "jni_shim.cc"),
                    f"-Wl,--version-script={DELEGATE_DIR / 'android' / 'jni_exports.map'}", "-ldl", "-o", str(jni)],
                   check=True)
    libraries = [fuse(MODELS / f"{stem}.tflite", tmp_path / f"{stem}-{target}", target=target,
                      cache_dir=private_cache).library
                 for stem, target in (("add_relu", "host"), ("conv_relu6", "host"), ("add_relu", "host-opencl"))]
    classes = _java_classes(jdk, tmp_path, ("TwoLibraries", JAVA_TWO_LIBRARIES))
    proc = subprocess.run([str(jdk / "java"), f"-Djava.library.path={jni.parent}", "-cp", str(classes), "TwoLibraries",
                           *map(str, libraries)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OCL_ICD_VENDORS": str(tmp_path / "none")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == ["true", "true", "[]"] * 3 + ["true", "[]", "[]", (
        "[dnnfusion: this device cannot run the kernels (require_device): no OpenCL device could be opened]"),
        "false", "IllegalArgumentException: dnnfusion: bad delegate option: claim: expected profitable, all or "
        "none, got 'most'"]
    loaded = [line for line in proc.stderr.splitlines() if "loaded the kernel bundle" in line]
    assert [line.split(" for ")[1].split(",")[0] for line in loaded] == [
        "add_relu.tflite (host", "conv_relu6.tflite (host", "add_relu.tflite (host-opencl"]
