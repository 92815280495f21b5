"""Cycles per invoke on a core's pipeline model, from the executions of each translated block.

The counting plugin (bench/arm64/counter.c, with ARM_COUNT_BLOCKS) records how often each block of
guest code QEMU translated ran inside a bracket, and the block's bytes. Each block is disassembled
(`llvm-mc`) and timed by LLVM's pipeline model of the core (`llvm-mca`) as the cycles of one pass in
steady state: the difference between 300 and 100 back-to-back passes, over 200, so the pipeline's
fill is not counted. A kernel's inner loop is one block, so its steady state is what the core runs.
Cycles per invoke = sum over blocks of executions x cycles per pass.

What such a model leaves out: cache misses and memory bandwidth (keep the memory-access count beside
it), branch mispredictions, and what the core's model itself gets wrong. The models are chosen and
their limits measured with microkernels of known cost (tests/test_arm_cycles.py; bench/RESULTS.md,
"ARM64 cycles"):
- big core: the emulated cortex-a76 runs on LLVM's `neoverse-n1` model: the N1 is the A76's core, and
  LLVM's `cortex-a76` name selects its Cortex-A57 model (a dependent-free pair of FMLAs a cycle, where
  the A76 issues two). llvm-mca dispatches up to 8 micro-ops a cycle; the A76 decodes 4 instructions,
  so a pass is charged at least a quarter cycle an instruction.
- little core: the emulated cortex-a53 (QEMU has no A55; XNNPACK then picks its in-order kernels) runs
  on LLVM's `cortex-a55` model, the little core phones ship now; LLVM's `cortex-a53` model gives an
  FMLA chain 10 cycles an instruction, where the A55's is 4. The A55 model is not the core in two ways
  that matter here: it issues no 64-bit load or insert beside an FMLA (the dual issue in-order GEMM
  kernels, XNNPACK's among them, are scheduled around), and it issues a 128-bit load in one cycle,
  where the core takes two. Both favour code like ours over XNNPACK's: little-core cycles are an
  indication, not a measure, until a model corrects them.

Needs LLVM 17 or later for the Neoverse N1 model (Debian: `apt-get install llvm-19`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Emulated core (qemu -cpu) -> LLVM pipeline model (llvm-mca -mcpu) and decode width.
PIPELINES = {"cortex-a76": ("neoverse-n1", 4), "cortex-a53": ("cortex-a55", 2)}
LLVM_VERSIONS = (22, 21, 20, 19, 18, 17)
PASSES = (100, 300)  # steady state = the difference of two runs, so the fill cancels
CHUNK = 400  # blocks per llvm-mca run (one region each)


class Unavailable(RuntimeError):
    """LLVM's tools with the needed pipeline models are not installed."""


@dataclass(frozen=True)
class Estimate:
    """Per-invoke cycles of one bracket on one core's pipeline model."""

    cycles: float
    insns: float  # instructions the timed blocks executed (equal to the plugin's total)
    unmodelled: float  # of those, in blocks the model could not read (charged a cycle each)
    hot: tuple[HotBlock, ...] = ()  # the blocks that take the most cycles, when asked for


def llvm_tool(name: str) -> str:
    """The newest installed `name` (llvm-mc, llvm-mca) with an LLVM recent enough."""
    for version in LLVM_VERSIONS:
        path = Path(f"/usr/lib/llvm-{version}/bin/{name}")
        if path.exists():
            return str(path)
    raise Unavailable(f"{name} of LLVM {LLVM_VERSIONS[-1]} or later is needed (apt-get install llvm-19)")


def read_blocks(path: Path) -> tuple[dict[int, bytes], dict[int, dict[int, int]]]:
    """The plugin's block file: code per block, and per closing mark tag the executions of each block."""
    code: dict[int, bytes] = {}
    counts: dict[int, dict[int, int]] = {}
    for line in path.read_text().splitlines():
        kind, *fields = line.split()
        if kind == "code":
            code[int(fields[0])] = bytes.fromhex(fields[2])
        elif kind == "count":
            counts.setdefault(int(fields[0]), {})[int(fields[1])] = int(fields[2])
    return code, counts


def disassemble(code: dict[int, bytes], mcpu: str) -> dict[int, list[str] | None]:
    """Each block's instructions as assembly text (None where one does not decode). One llvm-mc run,
    an instruction a line: its "invalid instruction encoding" warnings name the lines it printed
    nothing for (other warnings, such as a potentially undefined encoding, come with the instruction)."""
    order = [(block, i) for block, data in code.items() for i in range(0, len(data) - len(data) % 4, 4)]
    text = "\n".join(" ".join(f"0x{b:02x}" for b in code[block][i:i + 4]) for block, i in order) + "\n"
    proc = subprocess.run([llvm_tool("llvm-mc"), "--disassemble", "-triple=aarch64", f"-mcpu={mcpu}"],
                          input=text, capture_output=True, text=True, check=True)
    bad = {int(m.group(1)) - 1
           for m in re.finditer(r"<stdin>:(\d+):\d+: warning: invalid instruction encoding", proc.stderr)}
    decoded = iter(line.strip() for line in proc.stdout.splitlines() if line.strip() and not line.strip()[0] == ".")
    result: dict[int, list[str] | None] = {block: [] for block in code}
    for k, (block, _) in enumerate(order):
        if k in bad:
            result[block] = None
        elif result[block] is not None:
            result[block].append(next(decoded))
        else:
            next(decoded)
    for block, data in code.items():
        if len(data) % 4:  # not whole aarch64 instructions: not something to time
            result[block] = None
    return result


def _mca_total_cycles(blocks: list[tuple[str, list[str]]], mcpu: str, passes: int) -> dict[str, int]:
    source = "".join(f"# LLVM-MCA-BEGIN {name}\n" + "\n".join(insns) + "\n# LLVM-MCA-END\n" for name, insns in blocks)
    proc = subprocess.run([llvm_tool("llvm-mca"), "-mtriple=aarch64", f"-mcpu={mcpu}", f"-iterations={passes}",
                           "-all-views=false", "-summary-view"], input=source, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-500:])
    names = re.findall(r"Code Region - (\S+)", proc.stdout)
    cycles = [int(c) for c in re.findall(r"Total Cycles:\s+(\d+)", proc.stdout)]
    return dict(zip(names, cycles))


def cycles_per_pass(blocks: dict[str, list[str]], mcpu: str, decode_width: int) -> dict[str, float | None]:
    """Steady-state cycles of one pass of each block (named by any string without spaces); None for
    a block llvm-mca refuses."""
    result: dict[str, float | None] = {}
    items = list(blocks.items())
    for start in range(0, len(items), CHUNK):
        chunk = items[start:start + CHUNK]
        try:
            low, high = (_mca_total_cycles(chunk, mcpu, n) for n in PASSES)
        except RuntimeError:
            if len(chunk) == 1:
                result[chunk[0][0]] = None
                continue
            for name, insns in chunk:  # find the block it refuses
                result.update(cycles_per_pass({name: insns}, mcpu, decode_width))
            continue
        for name, insns in chunk:
            steady = (high[name] - low[name]) / (PASSES[1] - PASSES[0])
            result[name] = max(steady, len(insns) / decode_width)
    return result


class PipelineModel:
    """One core's pipeline model with its cycles per pass, cached by block content across runs in
    one JSON file: a block is disassembled and timed once, whatever run or case executes it."""

    def __init__(self, cpu: str, cache_dir: Path):
        self.mcpu, self.decode_width = PIPELINES[cpu]
        version = Path(llvm_tool("llvm-mca")).parents[1].name  # llvm-<version>
        self.path = cache_dir / f"arm-cycles-{version}-{self.mcpu}.json"
        self.per_pass: dict[str, float | None] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def _keys(self, code: dict[int, bytes], blocks) -> dict[int, str]:
        """Content keys of `blocks`, each timed (and the cache written) where new."""
        keys = {block: hashlib.sha256(code[block]).hexdigest()[:24] for block in blocks}
        missing = {block: code[block] for block, key in keys.items() if key not in self.per_pass}
        if missing:
            text = disassemble(missing, self.mcpu)
            self.per_pass.update(cycles_per_pass({keys[b]: insns for b, insns in text.items() if insns},
                                                 self.mcpu, self.decode_width))
            self.per_pass.update({keys[b]: None for b, insns in text.items() if not insns})
            self._save()
        return keys

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(f".{os.getpid()}.tmp")  # atomic: concurrent runs each leave a whole file
        partial.write_text(json.dumps(self.per_pass))
        os.replace(partial, self.path)

    def estimate(self, code: dict[int, bytes], executions: dict[int, float], hot: int = 0) -> Estimate:
        """Cycles of the executions given (per invoke, per block), and the `hot` blocks that take
        the most of them."""
        keys = self._keys(code, executions)
        costs, insns, unmodelled = {}, 0.0, 0.0
        for block, n in executions.items():
            size = len(code[block]) // 4
            per_pass = self.per_pass[keys[block]]
            insns += n * size
            if per_pass is None:
                unmodelled += n * size
            costs[block] = n * (size if per_pass is None else per_pass)
        cycles = sum(costs.values())
        ranked = sorted((b for b in costs if self.per_pass[keys[b]]), key=lambda b: -costs[b])[:hot]
        text = disassemble({b: code[b] for b in ranked}, self.mcpu) if ranked else {}
        blocks = tuple(HotBlock(costs[b] / cycles, executions[b], self.per_pass[keys[b]], tuple(text[b] or ()))
                       for b in ranked)
        return Estimate(cycles, insns, unmodelled, blocks)


# Mnemonics of multiply-accumulates (float and integer, vector and scalar): what a GEMM's rate is in.
MULTIPLY_ADDS = re.compile(r"^(fmla|fmls|fmadd|fmsub|sdot|udot|usdot|smlal2?|umlal2?|mla|sadalp|uadalp)\b")


# Multiply-adds a core completes a cycle at most, per arithmetic (lanes x vector multiply-adds issued a
# cycle; Arm's Software Optimization Guides): the A76 issues two 128-bit FMLAs or SDOTs a cycle, the
# A55 one FMLA (it has no dot product in the -nodot build's ARMv8.0, nor fp16 arithmetic). No schedule
# computes a model's multiply-adds in fewer cycles than these rates allow (`floor_cycles`).
PEAK_MULTIPLY_ADDS = {"cortex-a76": {"fp32": 8, "fp16": 16, "int8": 32}, "cortex-a53": {"fp32": 4}}


def floor_cycles(multiply_adds: dict[str, int], cpu: str) -> float | None:
    """The fewest cycles in which `cpu` completes `multiply_adds` ({arithmetic: count}) at its peak
    rate, on every pipeline model alike; None where the core's rate for an arithmetic is not known."""
    rates = PEAK_MULTIPLY_ADDS[cpu]
    if any(n and kind not in rates for kind, n in multiply_adds.items()):
        return None
    return sum(n / rates[kind] for kind, n in multiply_adds.items() if n)


@dataclass(frozen=True)
class HotBlock:
    """One translated block among those that take the most cycles: where the time goes, and what
    the model credits a kernel's inner loop with."""

    share: float  # of the bracket's cycles
    executions: float  # per invoke
    cycles_per_pass: float
    instructions: tuple[str, ...]

    @property
    def multiply_adds_per_cycle(self) -> float:
        """Multiply-accumulate instructions issued a cycle in steady state (a GEMM loop's rate)."""
        return sum(1 for i in self.instructions if MULTIPLY_ADDS.match(i)) / self.cycles_per_pass
