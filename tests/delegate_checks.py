"""Shared checks for a fused model's delegate: which nodes it should claim, and running it in
another Python (the emulated aarch64 one, a tflite-runtime 2.14 venv) against this process's
LiteRT reference."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np

from tflite_tools import runtime
from tflite_tools.fuse import FuseResult
from tflite_tools.model.reader import load
from tflite_tools.model.hybrid import hybrid_depths
from tflite_tools.run import RTOL, OutputError, compare, hybrid_rtol, quantized_outputs, reference_resolver

INVOKE = Path(__file__).parent / "invoke_with_delegate.py"


def planned_nodes(result: FuseResult, subgraph: int = 0) -> list[int]:
    """The nodes of every block of `subgraph` that has a kernel, and the decoders of their stored
    weights (the subgraph's first decoders; the delegate runs them): what it claims there with
    claim:all."""
    nodes = {n for k in result.kernels if k.kernel and k.subgraph == subgraph for n in k.nodes}
    operators = load(result.model).subgraphs[subgraph].operators
    decoders = result.decoders if subgraph == 0 else next(s.decoders for s in result.subgraphs if s.index == subgraph)
    for index in reversed(range(decoders)):  # a chain's later decoder first
        readers = {id(t) for n in nodes for t in operators[n].inputs if t is not None}
        if any(id(t) in readers for t in operators[index].outputs):
            nodes.add(index)
    return sorted(nodes)


def invoke_elsewhere(launch: Callable[[list[str]], subprocess.CompletedProcess], result: FuseResult, folder: Path,
                     seed: int, rtol: float = RTOL) -> tuple[list[OutputError], dict]:
    """Runs `result` with its delegate through invoke_with_delegate.py in the Python `launch`
    starts (it gets the script's arguments), on seeded random inputs passed as .npy files; returns
    the outputs' errors against LiteRT's reference here (float outputs held to `rtol` of their
    range) and the delegate's last claims report."""
    host = runtime.make_interpreter(result.model, reference_resolver(result.model))
    inputs = runtime.random_inputs(host, seed=seed)
    paths = []
    for k, array in enumerate(inputs):
        paths.append(folder / f"in{k}.npy")
        np.save(paths[-1], array)
    outs = [folder / f"out{k}.npy" for k in range(len(host.get_output_details()))]
    report = folder / "claims.jsonl"
    proc = launch([str(INVOKE), str(result.model), str(result.library), str(report), *map(str, paths), "--",
                   *map(str, outs)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Outputs that dynamic quantization reaches are held to its rule, as `run --compare` holds them.
    rtols = [hybrid_rtol(d, rtol) for d in hybrid_depths(load(result.model).main)]
    errors = compare([np.load(p) for p in outs], runtime.run(host, inputs), [str(p) for p in outs], rtols,
                     quantized=quantized_outputs(host))
    return errors, [json.loads(line) for line in report.read_text().splitlines()][-1]


def mobilenet_logits(folder: Path, stem: str = "mobilenet_v2_035_96") -> Path:
    """The test MobileNet (`stem`: a form of it) without its softmax, saved in `folder`. Its random
    weights shrink activations to ~1e-10 and the softmax output is a flat 1/16: compare the logits
    instead, where every conv, depthwise and residual counts."""
    import tflite_tools

    model = tflite_tools.load(Path(__file__).parent / "models" / f"{stem}.tflite")
    sg = model.main
    softmax = sg.operators.pop()
    assert softmax.name == "SOFTMAX"
    sg.outputs = [softmax.inputs[0]]
    sg.tensors.remove(softmax.outputs[0])
    model.signatures = []
    tflite_tools.save(model, folder / "logits.tflite")
    return folder / "logits.tflite"
