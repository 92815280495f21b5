"""Device side of the OpenCL check (bench/opencl_device/prepare.py says how to run it): the dnnfusion
OpenCL delegate end to end on a real GPU. Needs only numpy and ai_edge_litert; re-executes itself
once with the carried ICD loader on LD_LIBRARY_PATH and NVIDIA's ICD named in OCL_ICD_VENDORS.
"""
# ruff: noqa: E402 - the runtime is imported after the OpenCL environment is set up
import ctypes
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

def sh(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    print(f"$ {cmd}\n{(p.stdout + p.stderr).strip()[:1500]}")

sh("nvidia-smi -L")
sh("ls /etc/OpenCL/vendors 2>&1; cat /etc/OpenCL/vendors/*.icd 2>&1")
cands = [p for d in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
         for p in glob.glob(os.path.join(d, "libnvidia-opencl.so*"))]
print("libnvidia-opencl candidates:", cands)
# An ICD loader (Debian's ocl-icd, carried) and a vendors folder naming NVIDIA's ICD.
ocl = "/tmp/ocl"
os.makedirs(ocl, exist_ok=True)
src = os.path.join(HERE, "ocl/usr/lib/x86_64-linux-gnu/libOpenCL.so.1.0.0")
for name in ("libOpenCL.so", "libOpenCL.so.1"):
    dst = os.path.join(ocl, name)
    if not os.path.exists(dst):
        os.symlink(src, dst)
if not os.path.exists("/etc/OpenCL/vendors/nvidia.icd") and cands:
    os.makedirs("/tmp/vendors", exist_ok=True)
    open("/tmp/vendors/nvidia.icd", "w").write(cands[0] + "\n")
    os.environ["OCL_ICD_VENDORS"] = "/tmp/vendors"
if os.environ.get("LD_LIBRARY_PATH_SET") != "1":
    env = dict(os.environ, LD_LIBRARY_PATH=ocl + ":" + ":".join({os.path.dirname(c) for c in cands}) + ":" +
               os.environ.get("LD_LIBRARY_PATH", ""), LD_LIBRARY_PATH_SET="1",
               HL_OCL_DEVICE_TYPE=os.environ.get("HL_OCL_DEVICE_TYPE", "gpu"))  # "cpu" for PoCL
    sys.exit(subprocess.call([sys.executable] + sys.argv, env=env))

cl = ctypes.CDLL("libOpenCL.so.1")
n = ctypes.c_uint()
err = cl.clGetPlatformIDs(0, None, ctypes.byref(n))
print("clGetPlatformIDs:", err, "platforms:", n.value)
if n.value:
    plats = (ctypes.c_void_p * n.value)()
    cl.clGetPlatformIDs(n.value, plats, None)
    for p in plats:
        nd = ctypes.c_uint()
        cl.clGetDeviceIDs(ctypes.c_void_p(p), ctypes.c_ulonglong(0xFFFFFFFF), 0, None, ctypes.byref(nd))
        devs = (ctypes.c_void_p * max(nd.value, 1))()
        cl.clGetDeviceIDs(ctypes.c_void_p(p), ctypes.c_ulonglong(0xFFFFFFFF), nd.value, devs, None)
        for d in devs[:nd.value]:
            buf = ctypes.create_string_buffer(256)
            cl.clGetDeviceInfo(ctypes.c_void_p(d), 0x102B, 256, buf, None)  # CL_DEVICE_NAME
            ver = ctypes.create_string_buffer(256)
            cl.clGetDeviceInfo(ctypes.c_void_p(d), 0x102F, 256, ver, None)  # CL_DEVICE_VERSION
            print("OpenCL device:", buf.value.decode(), "|", ver.value.decode())

from ai_edge_litert.interpreter import Interpreter, load_delegate
import ai_edge_litert
print("ai_edge_litert", getattr(ai_edge_litert, "__version__", "?"), "numpy", np.__version__, flush=True)

def timeit(interp, n=20):
    interp.invoke()
    t = time.perf_counter()
    for _ in range(n):
        interp.invoke()
    return (time.perf_counter() - t) / n * 1e3

for name in sorted(os.listdir(HERE)):
    folder = os.path.join(HERE, name)
    if not os.path.exists(os.path.join(folder, "lib.txt")):
        continue
    lib = os.path.join(folder, open(os.path.join(folder, "lib.txt")).read().strip())
    model = os.path.join(folder, "model.fused.tflite")
    report = f"/tmp/{name}.jsonl"
    try:
        d = load_delegate(lib, options={"claim": "all", "report": report, "log_level": "warning"})
        it = Interpreter(model_path=model, experimental_delegates=[d], num_threads=1)
        it.allocate_tensors()
        xs = [np.load(p) for p in sorted(glob.glob(os.path.join(folder, "in*.npy")))]
        for det, x in zip(it.get_input_details(), xs):
            it.set_tensor(det["index"], x)
        it.invoke()
        worst = 0.0
        for k, det in enumerate(it.get_output_details()):
            ref = np.load(os.path.join(folder, f"ref{k}.npy"))
            out = it.get_tensor(det["index"])
            rel = float(np.abs(out.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))
            worst = max(worst, rel)
        claims = open(report).read().strip().splitlines()[-1]
        c = json.loads(claims)
        ms_gpu = timeit(it)
        cpu = Interpreter(model_path=model, num_threads=1)
        cpu.allocate_tensors()
        for det, x in zip(cpu.get_input_details(), xs):
            cpu.set_tensor(det["index"], x)
        ms_cpu = timeit(cpu)
        print(f"RESULT {name}: claimed {len(c['claimed_nodes'])} nodes, declined {len(c['declined'])}; "
              f"max rel err {worst:.3g} ({'ok' if worst <= 1e-4 else 'OUTSIDE 1e-4'}); "
              f"OpenCL delegate {ms_gpu:.3f} ms vs XNNPACK CPU 1 thread {ms_cpu:.3f} ms", flush=True)
    except Exception as exc:
        print(f"RESULT {name}: FAILED {type(exc).__name__}: {str(exc)[:800]}", flush=True)
