"""Device side of the GPU delegate check (prepare.py beside it says how to make the folder and run it).

For each model prepare.py fused, on whatever GPU this machine has: the dnnfusion delegate on OpenCL
and on Vulkan (claim:all), LiteRT's own GPU accelerator (CompiledModel, HardwareAccelerator.GPU),
and XNNPACK on the CPU at one thread and at every core. Each contender runs in a process of its own
(a driver that crashes costs one cell, not the run), is checked against LiteRT's reference outputs
(1e-4 of the output's range for the delegate, which computes in float32) and timed: median of
`--invokes` invokes after `--warmup`. Prints one line per cell and a markdown table, also written to
$OUT/gpu_check.md when OUT is set.

Needs only Python (the version prepare.py packed LiteRT for) and numpy. Everything else is in
payload.tar.xz beside this file, unpacked once into /tmp: the fused models and their references, LiteRT
(litert/, first on sys.path) and the OpenCL / Vulkan loaders (ocl/, gl/), put on LD_LIBRARY_PATH (the
process re-executes itself once so the loaders read it). NVIDIA's drivers are found where their container
mounts put them (/usr/local/nvidia); HL_OCL_DEVICE_TYPE=cpu and VK_DRIVER_FILES pointing at lavapipe
run the same check on PoCL and lavapipe, which is how it is tested.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PAYLOAD = os.path.join(HERE, "payload.tar.xz")
CONTENDERS = ["xnnpack-1", "xnnpack-all", "ours-opencl", "ours-vulkan", "litert-gpu"]
TOLERANCE = 1e-4
DRIVER_DIRS = ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
VULKAN_ICDS = ["/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json",
               "/etc/vulkan/icd.d/nvidia_icd.json"]


def device_environment() -> dict[str, str]:
    """This process's environment plus the carried loaders and, where the system names none, NVIDIA's
    OpenCL and Vulkan drivers."""
    env = dict(os.environ)
    root = unpacked()
    libs = [os.path.join(root, "ocl", "usr", "lib", "x86_64-linux-gnu"),
            os.path.join(root, "gl", "usr", "lib", "x86_64-linux-gnu")]
    opencl = [p for d in DRIVER_DIRS for p in glob.glob(os.path.join(d, "libnvidia-opencl.so*"))]
    if opencl and not os.path.exists("/etc/OpenCL/vendors/nvidia.icd") and "OCL_ICD_VENDORS" not in env:
        os.makedirs("/tmp/gpucheck-vendors", exist_ok=True)
        with open("/tmp/gpucheck-vendors/nvidia.icd", "w") as f:
            f.write(opencl[0] + "\n")
        env["OCL_ICD_VENDORS"] = "/tmp/gpucheck-vendors"
    libs += sorted({os.path.dirname(p) for p in opencl})
    vulkan = [p for p in VULKAN_ICDS if os.path.exists(p)]
    if vulkan and "VK_DRIVER_FILES" not in env and "VK_ICD_FILENAMES" not in env:
        env["VK_DRIVER_FILES"] = env["VK_ICD_FILENAMES"] = vulkan[0]
    env["LD_LIBRARY_PATH"] = ":".join(libs + [env.get("LD_LIBRARY_PATH", "")])
    env.setdefault("HL_OCL_DEVICE_TYPE", "gpu")
    env["GPUCHECK_ENV"] = "1"
    return env


def unpacked() -> str:
    """The payload's folder in /tmp, unpacked on first use (its size names it, so a new payload is
    never mistaken for an old one)."""
    root = f"/tmp/gpucheck-{os.path.getsize(PAYLOAD)}"
    if not os.path.isdir(root):
        with tarfile.open(PAYLOAD) as archive:
            # The "data" filter (Python 3.12; 3.11.4) refuses members that would land outside `root`.
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(root + ".part", **kwargs)
        os.replace(root + ".part", root)
    return root


def describe_machine() -> None:
    """Names the GPU and the OpenCL devices the loader sees."""
    import ctypes

    for cmd in ("nvidia-smi -L", "nproc"):
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        print(f"$ {cmd}\n{(p.stdout + p.stderr).strip()}")
    print("OCL_ICD_VENDORS:", os.environ.get("OCL_ICD_VENDORS"), "VK_DRIVER_FILES:", os.environ.get("VK_DRIVER_FILES"))
    try:
        cl = ctypes.CDLL("libOpenCL.so.1")
    except OSError as exc:
        print("no OpenCL loader:", exc)
        return
    n = ctypes.c_uint()
    cl.clGetPlatformIDs(0, None, ctypes.byref(n))
    plats = (ctypes.c_void_p * max(n.value, 1))()
    cl.clGetPlatformIDs(n.value, plats, None)
    for plat in plats[:n.value]:
        nd = ctypes.c_uint()
        cl.clGetDeviceIDs(ctypes.c_void_p(plat), ctypes.c_ulonglong(0xFFFFFFFF), 0, None, ctypes.byref(nd))
        devs = (ctypes.c_void_p * max(nd.value, 1))()
        cl.clGetDeviceIDs(ctypes.c_void_p(plat), ctypes.c_ulonglong(0xFFFFFFFF), nd.value, devs, None)
        for dev in devs[:nd.value]:
            name, version = ctypes.create_string_buffer(256), ctypes.create_string_buffer(256)
            cl.clGetDeviceInfo(ctypes.c_void_p(dev), 0x102B, 256, name, None)  # CL_DEVICE_NAME
            cl.clGetDeviceInfo(ctypes.c_void_p(dev), 0x102F, 256, version, None)  # CL_DEVICE_VERSION
            print("OpenCL device:", name.value.decode(), "|", version.value.decode())


def model_files(folder: str, api: str) -> tuple[str, str | None]:
    """The fused model (per API where prepare.py had to keep two) and the API's delegate library."""
    per_api = os.path.join(folder, api, "model.fused.tflite")
    model = per_api if os.path.exists(per_api) else os.path.join(folder, "model.fused.tflite")
    libs = glob.glob(os.path.join(folder, api, "lib*.so"))
    return model, libs[0] if libs else None


def median_ms(invoke, warmup: int, invokes: int) -> float:
    """Median wall time of one call of `invoke`, in ms."""
    for _ in range(warmup):
        invoke()
    times = []
    for _ in range(invokes):
        start = time.perf_counter()
        invoke()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def run_one(folder: str, contender: str, warmup: int, invokes: int) -> dict:
    """One cell: builds the contender, checks its outputs against the reference, times it."""
    import numpy as np

    sys.path.insert(0, os.path.join(unpacked(), "litert"))
    from ai_edge_litert.interpreter import Interpreter, load_delegate

    inputs = [np.load(p) for p in sorted(glob.glob(os.path.join(folder, "in*.npy")))]
    refs = [np.load(p) for p in sorted(glob.glob(os.path.join(folder, "ref*.npy")))]
    cell: dict = {}
    if contender == "litert-gpu":
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator

        model = CompiledModel.from_file(model_files(folder, "opencl")[0], hardware_accel=HardwareAccelerator.GPU)
        cell["fully_accelerated"] = model.is_fully_accelerated()
        ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
        for buf, x in zip(ins, inputs):
            buf.write(x)
        model.run_by_index(0, ins, outs)
        results = [buf.read(ref.size, ref.dtype).reshape(ref.shape) for buf, ref in zip(outs, refs)]
        run = lambda: model.run_by_index(0, ins, outs)  # noqa: E731
    else:
        api = contender.split("-")[1]
        delegates = []
        if contender.startswith("ours"):
            model, lib = model_files(folder, api)
            report = f"/tmp/gpucheck-{os.path.basename(folder)}-{api}.jsonl"
            delegates = [load_delegate(lib, options={"claim": "all", "report": report, "log_level": "warning"})]
            threads = 1
        else:
            model = model_files(folder, "opencl")[0]
            threads = 1 if api == "1" else os.cpu_count()
        interp = Interpreter(model_path=model, experimental_delegates=delegates, num_threads=threads)
        interp.allocate_tensors()
        for det, x in zip(interp.get_input_details(), inputs):
            interp.set_tensor(det["index"], x)
        interp.invoke()
        results = [interp.get_tensor(det["index"]) for det in interp.get_output_details()]
        if delegates:
            claims = json.loads(open(report).read().strip().splitlines()[-1])
            cell["claimed"], cell["declined"] = len(claims["claimed_nodes"]), len(claims["declined"])
        run = interp.invoke
    errors = [float(np.abs(y.astype(np.float64) - r).max() / max(float(np.abs(r).max()), 1e-30))
              for y, r in zip(results, refs)]
    cell["max_rel_err"] = max(errors)
    cell["ms"] = median_ms(run, warmup, invokes)
    return cell


def table(rows: list[dict]) -> str:
    """The markdown table: ms per contender and our time as a ratio of XNNPACK's one-thread time."""
    lines = ["| model | " + " | ".join(CONTENDERS) + " | ours-opencl / xnnpack-1 | ours-vulkan / xnnpack-1 |",
             "|---" * (len(CONTENDERS) + 3) + "|"]
    for row in rows:
        cells = []
        for name in CONTENDERS:
            cell = row[name]
            if "ms" not in cell:
                cells.append("failed")
            else:
                flag = "" if cell["max_rel_err"] <= TOLERANCE or name == "litert-gpu" else " (WRONG)"
                cells.append(f"{cell['ms']:.3f}{flag}")
        base = row["xnnpack-1"].get("ms")
        ratios = [f"{row[c]['ms'] / base:.2f}x" if base and "ms" in row[c] else "-" for c in ("ours-opencl", "ours-vulkan")]
        lines.append(f"| {row['model']} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    """Runs every (model, contender) cell in a child process and prints the results."""
    parser = argparse.ArgumentParser(description="the GPU delegate check (see the module docstring)")
    parser.add_argument("--one", nargs=2, metavar=("FOLDER", "CONTENDER"), help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--invokes", type=int, default=50)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args()
    if os.environ.get("GPUCHECK_ENV") != "1":
        return subprocess.call([sys.executable, *sys.argv], env=device_environment())
    if args.one:
        print("CELL " + json.dumps(run_one(*args.one, args.warmup, args.invokes)), flush=True)
        return 0
    describe_machine()
    rows = []
    for folder in sorted(glob.glob(os.path.join(unpacked(), "*", "in0.npy"))):
        folder = os.path.dirname(folder)
        row = {"model": os.path.basename(folder)}
        for contender in CONTENDERS:
            try:
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", folder, contender,
                                       "--warmup", str(args.warmup), "--invokes", str(args.invokes)],
                                      capture_output=True, text=True, timeout=args.timeout)
                found = [line for line in proc.stdout.splitlines() if line.startswith("CELL ")]
                row[contender] = (json.loads(found[-1][5:]) if found else
                                  {"error": f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-600:]}"})
            except subprocess.TimeoutExpired:
                row[contender] = {"error": f"over {args.timeout} s"}
            print(f"RESULT {row['model']} {contender}: {json.dumps(row[contender])}", flush=True)
        rows.append(row)
    text = table(rows)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_check.md"), "w") as f:
            f.write(text)
        with open(os.path.join(os.environ["OUT"], "gpu_check.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
