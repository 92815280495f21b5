"""`fuse -o OUT` as a hostile but fair user meets it: OUT switches all at once, nothing of the
user's is deleted, a damaged compile cache is rebuilt, and every failure of the machine's side (the
output location, the cache location, the compiler) is one line and exit code 2."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tflite_tools import cli
from tflite_tools.outdir import OWNER_FILE, OutputFolder
from tflite_tools.run import run

MODEL = "conv_relu6"
LIBRARY = "libconv_relu6_dnnfusion.so"


@pytest.fixture(autouse=True)
def shared_cache(tmp_path_factory, monkeypatch):
    """One compile cache for this module (the model has one small block), private to it."""
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "outputs-cache"))


def fuse_cli(capsys, model: Path, out: Path, *extra: str) -> tuple[int, str]:
    code = cli.main(["fuse", str(model), "-o", str(out), *extra])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("[")]  # progress lines
    assert len(lines) == 1 and lines[0].startswith("tflite_tools: error: "), err
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_records_what_fuse_wrote(capsys, tmp_path, model_path):
    out = tmp_path / "out"
    assert fuse_cli(capsys, model_path(MODEL), out)[0] == 0
    record = json.loads((out / OWNER_FILE).read_text())
    drawn = ["plan.svg"] if shutil.which("dot") else []  # Graphviz draws the plan where it is installed
    assert sorted(record["files"]) == sorted(["model.fused.tflite", LIBRARY, "plan.json", "report.md",
                                              "model_explorer/blocks.json", "model_explorer/claims.json", *drawn])
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging folder left beside it


def test_refuse_replaces_the_whole_set_and_drops_old_files(capsys, tmp_path, model_path):
    out = tmp_path / "out"
    assert fuse_cli(capsys, model_path(MODEL), out, "--emit-asm")[0] == 0
    assert (out / "asm").is_dir()
    assert fuse_cli(capsys, model_path(MODEL), out)[0] == 0
    assert not (out / "asm").exists()  # ours, from the earlier run: gone with it
    assert run(out / "model.fused.tflite", delegate=out / LIBRARY).ok


@pytest.mark.parametrize("user_file", ["asm/mine.s", "android/app/build.gradle", "notes.txt"])
def test_a_file_fuse_did_not_write_is_never_deleted(capsys, tmp_path, model_path, user_file):
    out = tmp_path / "out"
    assert fuse_cli(capsys, model_path(MODEL), out)[0] == 0
    (out / user_file).parent.mkdir(parents=True, exist_ok=True)
    (out / user_file).write_text("mine")
    before = snapshot(out)
    code, err = fuse_cli(capsys, model_path(MODEL), out, "--emit-asm")
    assert code == 2 and user_file in one_error_line(err)
    assert snapshot(out) == before


def test_a_foreign_folder_is_refused_an_empty_one_taken(capsys, tmp_path, model_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("print()")
    code, err = fuse_cli(capsys, model_path(MODEL), project)
    assert code == 2 and "main.py" in one_error_line(err)
    assert snapshot(project) == {"main.py": b"print()"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert fuse_cli(capsys, model_path(MODEL), empty)[0] == 0
    assert (empty / LIBRARY).exists()


@pytest.mark.parametrize("where", ["at a file", "under a file", "unwritable", "a dangling link", "a link loop",
                                   "a mount point"])
def test_bad_output_location_fails_before_compiling(capsys, tmp_path, model_path, monkeypatch, where):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    out = {"at a file": tmp_path / "file", "under a file": tmp_path / "file" / "out",
           "unwritable": Path("/proc/dnnfusion-test/out"), "a dangling link": tmp_path / "dangling",
           "a link loop": tmp_path / "loop", "a mount point": tmp_path / "volume"}[where]
    if where == "a mount point":  # a Docker volume or a tmpfs (mounting one needs privileges tests lack)
        out.mkdir()
        real = os.path.ismount
        monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == out or real(p))
    import tflite_tools.fuse

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled before checking the output location")

    monkeypatch.setattr(tflite_tools.fuse, "compile_kernel", no_compiling)
    code, err = fuse_cli(capsys, model_path(MODEL), out)
    assert code == 2 and str(out.name) in one_error_line(err)
    assert (tmp_path / "file").read_text() == "x"


def test_a_failed_fuse_leaves_out_as_it_was(capsys, tmp_path, model_path, monkeypatch):
    out = tmp_path / "out"
    assert fuse_cli(capsys, model_path(MODEL), out)[0] == 0
    before = snapshot(out)
    import tflite_tools.fuse

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / LIBRARY))

    monkeypatch.setattr(tflite_tools.fuse, "link_delegate", full_disk)
    code, err = fuse_cli(capsys, model_path(MODEL), out)
    assert code == 2 and "No space left on device" in one_error_line(err)
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    code, _ = fuse_cli(capsys, model_path(MODEL), tmp_path / "new")
    assert code == 2 and not (tmp_path / "new").exists()  # a failed first fuse creates no OUT


def test_a_killed_fuse_leaves_no_mixture_and_its_leftovers_go(tmp_path, model_path):
    out = tmp_path / "out"
    script = (f"import os, tflite_tools.outdir as o\n"
              f"s = o.OutputFolder.prepare({str(out)!r})\n"
              f"(s.path / 'plan.json').write_text('new')\n"
              f"os.kill(os.getpid(), 9)\n")
    subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert not out.exists()
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-")
    OutputFolder.prepare(out).discard()  # the next run sweeps it
    assert list(tmp_path.iterdir()) == []


def test_commit_swaps_in_one_step(tmp_path):
    out = tmp_path / "out"
    first = OutputFolder.prepare(out)
    (first.path / "a.txt").write_text("1")
    first.commit()
    second = OutputFolder.prepare(out)
    (second.path / "b.txt").write_text("2")
    second.commit()
    assert sorted(p.name for p in out.iterdir()) == [OWNER_FILE, "b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_library_changed_since_fuse_is_refused_before_loading(capsys, tmp_path, model_path):
    # Found by the mutation fuzzer: 64 garbage bytes in the library's code segfaulted `run`.
    out = tmp_path / "out"
    assert fuse_cli(capsys, model_path(MODEL), out)[0] == 0
    library = out / LIBRARY
    raw = bytearray(library.read_bytes())
    raw[len(raw) // 3:len(raw) // 3 + 64] = bytes(range(64))
    library.write_bytes(bytes(raw))
    assert cli.main(["run", str(out / "model.fused.tflite"), "--delegate", str(library)]) == 2
    assert "changed since fuse wrote it" in capsys.readouterr().err


def test_damaged_kernel_in_the_cache_is_recompiled(capsys, tmp_path, model_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(cache))
    assert fuse_cli(capsys, model_path(MODEL), tmp_path / "a")[0] == 0
    (library,) = (cache / "kernels").glob("host-*/*.a")
    raw = bytearray(library.read_bytes())
    raw[len(raw) // 2:len(raw) // 2 + 64] = b"\x0f\x0b" * 32  # ud2: SIGILL if it ever ran
    library.write_bytes(bytes(raw))
    code, err = fuse_cli(capsys, model_path(MODEL), tmp_path / "b")
    assert code == 0 and "tflite_tools: warning: cache entry" in err and "damaged" in err
    result = run(tmp_path / "b" / "model.fused.tflite", delegate=tmp_path / "b" / LIBRARY, options={"claim": "all"})
    assert result.ok and result.claims["claimed_nodes"]


@pytest.mark.parametrize("compiler,fragment", [("/nonexistent/g++", "not found"), ("false", "failed")])
def test_missing_or_failing_compiler(capsys, tmp_path, model_path, monkeypatch, compiler, fragment):
    monkeypatch.setenv("DNNFUSION_CXX_X86", compiler)
    code, err = fuse_cli(capsys, model_path(MODEL), tmp_path / "out")
    assert code == 2 and fragment in one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def test_unusable_cache_dir(capsys, tmp_path, model_path, monkeypatch):
    (tmp_path / "cache").write_text("a file in the way")
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(tmp_path / "cache"))
    code, err = fuse_cli(capsys, model_path(MODEL), tmp_path / "out")
    assert code == 2 and "DNNFUSION_CACHE_DIR" in one_error_line(err)
    assert not (tmp_path / "out").exists()


def test_a_full_cache_disk_is_one_line_before_llvm_writes_to_it(capsys, tmp_path, model_path, monkeypatch):
    # LLVM writing a kernel onto a full disk ends the process (exit 1, "IO failure on output
    # stream"), leaving a build folder behind: too little free space is refused before a compile.
    import shutil

    import halide_gen.cache

    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(tmp_path / "cache"))
    real = shutil.disk_usage
    full = lambda p: real(p)._replace(free=5 << 20) if str(p).startswith(str(tmp_path / "cache")) else real(p)  # noqa: E731
    monkeypatch.setattr(halide_gen.cache.shutil, "disk_usage", full)
    code, err = fuse_cli(capsys, model_path(MODEL), tmp_path / "out")
    line = one_error_line(err)
    assert code == 2 and "5 MiB free" in line and "DNNFUSION_CACHE_DIR" in line
    assert not (tmp_path / "out").exists()
    assert not [p for p in (tmp_path / "cache").rglob(".tmp-*")]


def test_a_full_output_disk_is_one_line_before_compiling(capsys, tmp_path, model_path, monkeypatch):
    # A disk that filled while the delegate linked said only "ld returned 1 exit status".
    import shutil

    import tflite_tools.fuse

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(tflite_tools.fuse.shutil, "disk_usage", lambda p: usage._replace(free=3 << 20))
    monkeypatch.setattr(tflite_tools.fuse, "compile_kernel", lambda *a, **k: pytest.fail("compiled first"))
    code, err = fuse_cli(capsys, model_path(MODEL), tmp_path / "out")
    assert code == 2 and "3 MiB free on its disk" in one_error_line(err)
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging folder left


@pytest.mark.parametrize("failure", ["halide", "python"])
def test_a_block_the_generator_cannot_build_is_left_to_tflite(capsys, tmp_path, model_path, monkeypatch, failure):
    # A fault of the code generator on one block (Halide refusing a schedule, a bug in a template)
    # declines that block with one warning line and its reason in report.md and plan.json; the rest
    # of the model is fused, claimed and matches LiteRT.
    import halide as hl

    import halide_gen.aot

    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(tmp_path / "cache"))  # nothing compiled before
    schedule = halide_gen.aot.schedule_from

    def failing(kernel, *args):
        if any(op.name == "CONCATENATION" for op in kernel.ops):
            raise (hl.HalideError("Error: In schedule for f, could not find split dimension: c") if failure == "halide"
                   else IndexError("list index out of range"))
        return schedule(kernel, *args)

    monkeypatch.setattr(halide_gen.aot, "schedule_from", failing)
    out = tmp_path / "out"
    code, err = fuse_cli(capsys, model_path("unet_tiny"), out)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("tflite_tools: warning: ")]
    assert len(warnings) >= 1 and all("is left to TFLite: cannot be built" in w for w in warnings), err
    plan = json.loads((out / "plan.json").read_text())
    declined = [k for k in plan["kernels"] if "CONCATENATION" in k["ops"]]
    built = [k for k in plan["kernels"] if k["kernel"]]
    assert declined and all(k["kernel"] is None and "cannot be built" in k["skipped"] for k in declined)
    assert built and "cannot be built" in (out / "report.md").read_text()
    outcome = run(out / "model.fused.tflite", delegate=out / "libunet_tiny_dnnfusion.so", options={"claim": "all"})
    assert outcome.ok, outcome.errors
    assert outcome.claims["claimed_nodes"] == sorted(n for k in built for n in k["nodes"])


def test_a_model_name_past_the_file_name_limit_gets_a_shortened_library(capsys, tmp_path, model_path):
    # 245 characters of model name made a library name over the filesystem's 255-byte limit: the
    # link failed with only "ld returned 1 exit status". The name keeps its start and a digest.
    import shutil

    model = tmp_path / ("m" * 245 + ".tflite")
    shutil.copy(model_path(MODEL), model)
    out = tmp_path / "out"
    code, err = fuse_cli(capsys, model, out)
    assert code == 0, err
    (library,) = out.glob("lib*_dnnfusion.so")
    assert len(library.name) <= 255 and library.name.startswith("lib" + "m" * 100)
    assert run(out / "model.fused.tflite", delegate=library, options={"claim": "all"}).ok
