"""Schedule sources: the autoschedulers produce correct kernels; the host profiler answers yellow cells."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

import tflite_tools
from fusion.ecg import build_ecg
from fusion.plan import plan_fusion
from halide_gen.block import build_block
from halide_gen.jit import JitKernel
from halide_gen.schedule import TEMPLATE_VARIANTS, is_template
from halide_gen.schedule.auto import CPU_AUTOSCHEDULERS, schedule_auto
from tflite_tools import runtime
from opcheck import FLOAT_RTOL
from halide_gen.schedule.params import X86 as X86_PARAMS
from halide_text import compiled_stmts, lowered_stmt, scheduled_stmt, stable_name


def first_block(model_path, stem):
    model = tflite_tools.load(model_path(stem))
    plan = plan_fusion(build_ecg(model.main))
    block = plan.blocks[0]
    return model, [plan.ecg.nodes[i].op for i in block.ops], block


def only_block_kernel(model):
    """The ops of a model planned as one block, and that block's kernel (not yet scheduled)."""
    plan = plan_fusion(build_ecg(model.main))
    (block,) = plan.blocks
    ops = [plan.ecg.nodes[i].op for i in block.ops]
    return ops, build_block(block.name, ops, block.outputs)


@pytest.mark.parametrize("autoscheduler", CPU_AUTOSCHEDULERS)
@pytest.mark.parametrize("stem", ["swish_chain", "conv_relu6"])
def test_autoscheduled_kernels_match_litert(model_path, stem, autoscheduler):
    model, ops, block = first_block(model_path, stem)
    kernel = JitKernel(build_block("auto", ops, block.outputs), schedule=lambda k: schedule_auto(k, autoscheduler))
    _check_against_litert(model_path, stem, model, kernel)


@pytest.mark.parametrize("variant", TEMPLATE_VARIANTS["x86"])
def test_template_variants_are_schedule_sources_and_match_litert(model_path, variant):
    # A variant of the x86 templates' parameters (the 7-pixel conv tiles a Zen 5 host chose) is a
    # source `fuse --autoschedulers` times next to the defaults; its kernels are as exact.
    from halide_gen.profile import jit_kernel, schedule_sources

    assert variant in schedule_sources("host") and is_template(variant)
    model, ops, block = first_block(model_path, "conv_relu6")
    _check_against_litert(model_path, "conv_relu6", model, jit_kernel("variant", ops, block.outputs, variant))
    from halide_gen.schedule import schedule_for
    from halide_gen.targets import target_spec

    with pytest.raises(ValueError, match="no template variant"):  # never another family's parameters
        schedule_for(build_block("variant", ops, block.outputs), target_spec("arm64-linux"), variant)


@pytest.mark.parametrize("times, best", [
    ({"template": 1.0, "template-7px": 0.97, "Adams2019": 0.99}, "template"),  # within the noise
    ({"template": 1.0, "template-7px": 0.90, "Adams2019": 0.94}, "template-7px"),
])
def test_another_source_replaces_the_templates_only_when_clearly_faster(monkeypatch, times, best):
    from halide_gen import profile

    monkeypatch.setattr(profile, "jit_kernel", lambda name, ops, outputs, source, target: source)
    monkeypatch.setattr(profile, "_kernel_seconds", lambda source, inputs, min_seconds, seed: times[source])
    choice = profile.choose_schedule([], [], [], sources=list(times))
    assert choice.best == best and choice.seconds == times


def _check_against_litert(model_path, stem, model, kernel) -> None:
    interp = runtime.make_interpreter(model_path(stem), resolver="reference")
    inputs = runtime.random_inputs(interp, 4)
    (expected,) = runtime.run(interp, inputs)
    (got,) = kernel(kernel.inputs_from({id(t): a for t, a in zip(model.main.inputs, inputs)}))
    assert np.abs(expected - got).max() <= FLOAT_RTOL * np.abs(expected).max()


def test_host_profiler_answers_yellow_cells(model_path, tmp_path, monkeypatch, capsys):
    # The transformer's plan has yellow cells (Reorganize/Shuffle into BATCH_MATMUL); with the
    # profiler as cost source they are decided by timed kernels and the answers are cached.
    import json

    from tflite_tools import cli

    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(tmp_path))
    assert cli.main(["fuse", "--plan-only", "--json", "--cost", "profile", str(model_path("transformer_encoder"))]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cost_queries"] > 0
    from halide_gen.aot import generator_digest

    cached = json.loads((tmp_path / f"cost-host-profiler-{generator_digest()}.json").read_text())
    assert cached and all(v > 0 for v in cached.values())
    covered = sorted(i for b in data["blocks"] for i in b["ops"])
    assert covered == list(range(data["ops_after_rewrite"]))


@pytest.mark.parametrize("channels, width", [(1280, 7), (96, 112), (24, 56), (144, 28), (1000, 1), (768, 128), (3, 5)])
@pytest.mark.parametrize("steps", [1, 4])
def test_modelled_register_tile_fits_the_registers_and_the_op(channels, width, steps):
    # NEON's register tile (schedule.tiles.modelled_tile): accumulators, one input vector per pixel
    # and one step's weights within 31 of the 32 registers, a channel tile dividing the packed
    # channel count, and no wider than the op.
    from halide_gen.pack import padded
    from halide_gen.schedule.params import NEON
    from halide_gen.schedule.tiles import modelled_tile

    size, pixels = modelled_tile(channels, width, NEON.lanes, NEON.registers, True, steps)
    vectors = size // NEON.lanes
    assert vectors * pixels + pixels + vectors <= NEON.registers - 1
    assert padded(channels) % size == 0 and 1 <= pixels <= width


def test_modelled_tile_prefers_whole_rows_to_a_tail():
    from halide_gen.schedule.tiles import modelled_tile

    assert modelled_tile(1280, 7, 4, 32, True, 4) == (8, 7)  # 7 pixels: no 6 + 1
    assert modelled_tile(1000, 1, 4, 32, True, 4) == (32, 1)  # a GEMV: the widest tile that fits


def _residual(channels: int, inputs: int, hw: tuple[int, int], stride: int, kernel: int, activation_between: bool):
    """x (`inputs` channels) -> 1x1 conv (+RELU6) [-> HARD_SWISH] -> k x k depthwise (SAME, stride) -> 1x1 conv, and a
    depthwise straight on the graph input: the two sources padding can be read in place from."""
    rng = np.random.default_rng(channels + stride + kernel)
    b = tflite_tools.ModelBuilder()

    def const(name, *shape):
        return b.const(name, (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32))

    h, w = hw
    x = b.input("x", [1, h, w, inputs])
    y = b.op("CONV_2D", [x, const("w0", channels, 1, 1, inputs), const("b0", channels)], [1, h, w, channels],
             padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    if activation_between:
        y = b.op("HARD_SWISH", [y], [1, h, w, channels])
    oh, ow = -(-h // stride), -(-w // stride)
    y = b.op("DEPTHWISE_CONV_2D", [y, const("w1", 1, kernel, kernel, channels), const("b1", channels)],
             [1, oh, ow, channels], padding="SAME", stride_h=stride, stride_w=stride, depth_multiplier=1)
    y = b.op("CONV_2D", [y, const("w2", inputs, 1, 1, channels), const("b2", inputs)], [1, oh, ow, inputs],
             padding="SAME", stride_h=1, stride_w=1)
    z = b.op("DEPTHWISE_CONV_2D", [x, const("w3", 1, kernel, kernel, inputs), const("b3", inputs)],
             [1, oh, ow, inputs], padding="SAME", stride_h=stride, stride_w=stride, depth_multiplier=1)
    b.output(b.op("ADD", [y, z], [1, oh, ow, inputs]))
    return b.build()


@pytest.mark.parametrize("channels, inputs, stride, kernel, activation_between, in_place", [
    (32, 16, 1, 3, False, 2),   # a conv result and the graph input: both read in place
    (32, 16, 2, 5, False, 2),   # stride 2, SAME's uneven padding, 5x5 taps
    # 24 channels in 16-channel depthwise tiles: a conv result is readable past its last channel
    # (its packed weights are zero there), read in place; a graph input is not, a copy (no gathers)
    (24, 16, 1, 3, False, 2),
    (32, 24, 1, 3, False, 1),
    (32, 16, 1, 3, True, 1),    # an activation between: a copy (else recomputed at every tap)
])
def test_padding_read_in_place_where_its_source_is_in_memory(channels, inputs, stride, kernel, activation_between,
                                                              in_place):
    # A zero-padded input is read inline (loop partitioning leaves the bounds test on the border
    # tiles only) where what it pads is realised anyway, and copied otherwise; both are exact, on
    # a 9 x 11 map whose rows and columns end mid-tile, for the x86 and the NEON tiles.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.params import NEON, X86
    from halide_gen.schedule.cpu import padding_inlined

    model = _residual(channels, inputs, (9, 11), stride, kernel, activation_between)
    plan = plan_fusion(build_ecg(model.main))
    inlined = 0
    for block in plan.blocks:
        kernel_ = build_block(block.name, [plan.ecg.nodes[i].op for i in block.ops], block.outputs)
        inlined += len(padding_inlined(kernel_, X86))
    assert inlined == in_place
    for params in (X86, NEON):
        check_model_blocks(model, params=params)


def test_transposed_matmul_operand_is_copied_in_square_tiles_and_exact():
    # QK^T as converters write it: K's transpose moves the innermost axis, so its copy before the
    # matrix product is scheduled in 16 x 16 tiles (schedule.vectors.tile_transpose) instead of one
    # gather per vector; 40 x 24 per head leaves partial tiles on both axes.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.params import NEON, X86
    from halide_gen.schedule.vectors import tile_transpose

    b = tflite_tools.ModelBuilder()
    q, k = b.input("q", [1, 40, 2, 24]), b.input("k", [1, 40, 2, 24])
    qt = b.op("TRANSPOSE", [q, b.const("pq", np.array([0, 2, 1, 3], np.int32))], [1, 2, 40, 24])
    kt = b.op("TRANSPOSE", [k, b.const("pk", np.array([0, 2, 3, 1], np.int32))], [1, 2, 24, 40])
    b.output(b.op("BATCH_MATMUL", [qt, kt], [1, 2, 40, 40]))
    model = b.build()
    ops, kernel = only_block_kernel(model)
    tiled = [op for op in ops if op.name == "TRANSPOSE" and tile_transpose(kernel.values[id(op.outputs[0])], X86, set())]
    assert [list(op.inputs[1].data) for op in tiled] == [[0, 2, 3, 1]]  # K's, not Q's (innermost kept)
    for params in (X86, NEON):
        check_model_blocks(model, params=params)


@pytest.mark.parametrize("rows, depth, key_output", [(128, 26, False), (16, 32, True), (40, 13, True)])
def test_a_tiled_transpose_that_is_also_a_root_or_an_output_is_scheduled_once(rows, depth, key_output):
    # K^T tiled for its matrix product, and also read broadcast (128 keys against a head of 26:
    # a root of its own) or a block output (vectorized as one): a second schedule of the tiled axis
    # was a Halide error that ended the fuse.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.params import NEON, X86

    b = tflite_tools.ModelBuilder()
    q, k = b.input("q", [1, rows, 2, depth]), b.input("k", [1, rows, 2, depth])
    qt = b.op("TRANSPOSE", [q, b.const("pq", np.array([0, 2, 1, 3], np.int32))], [1, 2, rows, depth])
    kt = b.op("TRANSPOSE", [k, b.const("pk", np.array([0, 2, 3, 1], np.int32))], [1, 2, depth, rows])
    b.output(b.op("BATCH_MATMUL", [qt, kt], [1, 2, rows, rows]), *([kt] if key_output else []))
    for params in (X86, NEON):
        check_model_blocks(b.build(), params=params)


@pytest.mark.parametrize("params_name", ["X86", "NEON"])
def test_a_transposed_block_output_is_written_in_square_tiles_and_exact(params_name):
    # A decoder's K cache updated in place of one position, then transposed for QK^T in another
    # block: both are block outputs. Vectorized along its innermost axis, the transpose gathered
    # one element per lane from rows 3 x 64 floats apart (the block 2.3x its time in tiles).
    from blockcheck import check_model_blocks
    from halide_gen.schedule import params as cpu_params
    from halide_gen.schedule import schedule_cpu

    b = tflite_tools.ModelBuilder()
    cache, update = b.input("cache", [1, 40, 3, 24]), b.input("update", [1, 1, 3, 24])
    position = b.input("position", [4], dtype="int32")
    new = b.op("DYNAMIC_UPDATE_SLICE", [cache, b.op("MUL", [update, update], [1, 1, 3, 24]), position],
               [1, 40, 3, 24])
    keys = b.op("TRANSPOSE", [new, b.const("perm", np.array([0, 2, 3, 1], np.int32))], [1, 3, 24, 40])
    b.output(new, keys)
    model = b.build()
    params = getattr(cpu_params, params_name)
    _, kernel = only_block_kernel(model)
    schedule_cpu(kernel, params)
    transposed = stable_name(kernel.outputs[-1][1].func)
    assert re.search(rf"for \({re.escape(transposed)}\.s0\.c\.c,", lowered_stmt(kernel)), "not tiled"
    check_model_blocks(model, params=params)


@pytest.mark.parametrize("params_name", ["X86", "NEON", "NEON_FP16"])
def test_a_transposed_tile_is_staged_where_the_target_transposes_in_registers(params_name):
    # A decoder's key cache transposed for attention. NEON: each tile's input rows loaded a vector
    # each into a staged tile, then transposed in registers (25 instructions a 4 x 4 tile where lane
    # loads took 34: the decoders' ARM64 counts per token). x86: the unrolled reads, which LLVM
    # shuffles faster itself there.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import params as cpu_params
    from halide_gen.schedule import schedule_cpu

    b = tflite_tools.ModelBuilder()
    cache = b.input("cache", [1, 40, 3, 24])
    keys = b.op("TRANSPOSE", [b.op("ADD", [cache, cache], [1, 40, 3, 24]),
                              b.const("perm", np.array([0, 2, 3, 1], np.int32))], [1, 3, 24, 40])
    b.output(keys)
    model = b.build()
    params = getattr(cpu_params, params_name)
    _, kernel = only_block_kernel(model)
    schedule_cpu(kernel, params)
    staged = re.search(r"allocate \S*_tile\[", lowered_stmt(kernel)) is not None
    assert staged == params.stage_transpose_tiles == (params_name != "X86")
    check_model_blocks(model, params=params)


@pytest.mark.parametrize("params_name", ["X86", "NEON"])
def test_a_transposed_output_split_among_threads_by_its_tiled_axis_builds(params_name):
    # A Gemma-style decoder's prefill writes its one key head's cache transposed, [1, 1, 256, 512]:
    # the axis the tiles of the transpose split is also the one its rows are shared among threads
    # by, and asking for the old axis after the split was a Halide error that left the block to
    # TFLite. The tile loops keep the axes' names.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import params as cpu_params
    from halide_gen.schedule import schedule_cpu

    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 1, 512, 256])
    doubled = b.op("ADD", [x, x], [1, 1, 512, 256])
    b.output(b.op("TRANSPOSE", [doubled, b.const("perm", np.array([0, 1, 3, 2], np.int32))], [1, 1, 256, 512]))
    model = b.build()
    params = getattr(cpu_params, params_name)
    _, kernel = only_block_kernel(model)
    schedule_cpu(kernel, params)
    stmt = lowered_stmt(kernel)
    assert "halide_do_par_for" in stmt and re.search(r"\.s0\.c\.c,", stmt), "not tiled, or not parallel"
    check_model_blocks(model, params=params)


@pytest.mark.parametrize("dynamic_range", [False, True])
def test_dot_product_fc_weights_are_blocked_by_channel_tile(dynamic_range):
    # A decoder's every FC is a matrix-vector product that streams its weights from memory once:
    # laid out 4-deep with all output channels innermost ("dot4"), each channel tile read 128 bytes
    # a whole row of channels apart; blocked, each tile's weights are one run (tiles as the float
    # weights take them).
    from blockcheck import check_model_blocks
    from tflite_tools.model.builder import quantization

    rng = np.random.default_rng(0)
    b = tflite_tools.ModelBuilder()
    scales = quantization(rng.uniform(0.002, 0.02, 40), 0, axis=0)
    weights = b.const("w", rng.integers(-127, 128, (40, 64)).astype(np.int8), "int8", quant=scales)
    if dynamic_range:
        x = b.input("x", [1, 64])
        b.output(b.op("FULLY_CONNECTED", [x, weights, None], [1, 40], dtype="float32"))
    else:
        x = b.input("x", [1, 64], dtype="int8", quant=quantization([0.05], 3))
        b.output(b.op("FULLY_CONNECTED", [x, weights, None], [1, 40], dtype="int8", quant=quantization([0.2], -1)))
    model = b.build()
    _, kernel = only_block_kernel(model)
    assert "dot4_blocked" in [a.pack for a in kernel.arguments if a.tensor is model.main.operators[0].inputs[1]]
    check_model_blocks(model)


def _realized_producers(model):
    """Per block: (what a reduction reads, whether the schedule realises it) for every in-block
    input of a convolution or matrix product that an op with arithmetic of its own computes."""
    from fusion.mapping import REORG, SHUFFLE, op_mapping
    from halide_gen.schedule.cpu import schedule_cpu

    plan = plan_fusion(build_ecg(model.main))
    found = []
    for block in plan.blocks:
        if block.opaque_reason:
            continue
        ops = [plan.ecg.nodes[i].op for i in block.ops]
        kernel = build_block(block.name, ops, block.outputs)
        if not kernel.accumulators:
            continue
        schedule_cpu(kernel)
        stmt = lowered_stmt(kernel)
        produced = {id(t): op for op in ops for t in op.outputs}
        for acc in kernel.accumulators:
            helpers = kernel.op_helpers[acc.op_index]
            for t in kernel.ops[acc.op_index].inputs:
                producer = produced.get(id(t)) if t is not None else None
                if producer is None or op_mapping(producer) in (REORG, SHUFFLE):
                    continue
                funcs = [kernel.values[id(t)].func] + [h.func for h in helpers]
                found.append((producer.name, any(f"produce {stable_name(f)} " in stmt for f in funcs)))
    return found


@pytest.mark.parametrize("stem", ["transformer_encoder", "swish_chain", "mobilenet_v2_035_96", "unet_tiny",
                                  "depthwise_residual"])
def test_no_producer_is_recomputed_inside_a_reduction(model_path, stem):
    # A fused op feeding a convolution or matrix product is computed once (realised at the root,
    # per row, or in a padded copy), never inlined into the reduction, where it would run again for
    # every output channel: a GELU before a fully-connected layer once made a GPT-style decoder's
    # GELU FC ADD blocks 4x the time their FLOPs take.
    found = _realized_producers(tflite_tools.load(model_path(stem)))
    assert all(realised for _, realised in found), found


def _unary_ops() -> list[tuple[str, dict]]:
    """Every float elementwise op of one input the lowering knows, with the options it needs."""
    from halide_gen.lower.elementwise import CLAMPING_UNARY, UNARY

    return [(name, {}) for name in sorted({*UNARY, *CLAMPING_UNARY})] + [
        ("GELU", {"approximate": False}), ("GELU", {"approximate": True}), ("LEAKY_RELU", {"alpha": 0.2})]


@pytest.mark.parametrize("reduction", ["FULLY_CONNECTED", "CONV_2D"])
@pytest.mark.parametrize("op, options", _unary_ops(), ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={x}" for k, x in v.items()))
def test_every_activation_before_a_reduction_is_computed_once_per_element(op, options, reduction):
    # The class a GELU before a fully-connected layer once belonged to (4x a GPT block's FLOP time):
    # whatever elementwise op feeds a matrix product or convolution is realised, not inlined into
    # the reduction, where it would run again for every output channel.
    b = tflite_tools.ModelBuilder()
    rng = np.random.default_rng(0)
    shape = [1, 64, 128] if reduction == "FULLY_CONNECTED" else [1, 8, 8, 32]
    x = b.input("x", shape)
    a = b.op(op, [x], shape, **options)
    if reduction == "FULLY_CONNECTED":
        w = b.const("w", (rng.standard_normal((256, 128)) / 11).astype(np.float32))
        b.output(b.op("FULLY_CONNECTED", [a, w, None], [1, 64, 256], keep_num_dims=True))
    else:
        w = b.const("w", (rng.standard_normal((48, 3, 3, 32)) / 17).astype(np.float32))
        b.output(b.op("CONV_2D", [a, w, b.const("b", np.zeros(48, np.float32))], [1, 8, 8, 48], padding="SAME",
                      stride_h=1, stride_w=1))
    assert _realized_producers(b.build()) == [(op, True)]


def _stores_per_element(trace: str, func: str) -> Counter:
    """How many times each element of `func` was stored, from Halide's text trace of a run
    ("Store f.0(x, y) = v", vector coordinates as "<a, b, ...>")."""
    stored: Counter = Counter()
    for line in trace.splitlines():
        m = re.match(rf"Store {re.escape(func)}\.\d+\((.*?)\) = ", line)
        if not m:
            continue
        coords = [[int(v) for v in c.strip("<>").split(",")] for c in re.findall(r"<[^>]*>|-?\d+", m.group(1))]
        lanes = max(len(c) for c in coords)
        stored.update(zip(*(c * lanes if len(c) == 1 else c for c in coords)))
    return stored


@pytest.mark.parametrize("reduction", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("op, options", _unary_ops(), ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={x}" for k, x in v.items()))
def test_every_activation_after_a_reduction_is_computed_once_per_element(op, options, reduction, capfd):
    # The epilogue side of the same class: an activation after a matrix product or convolution
    # runs in the reduction's register tile, once per output element, never once per reduction
    # step or again where tiles overlap. Every Func the schedule realises that holds the
    # activation is traced (Halide's store trace) and each element must be stored exactly once.
    from halide_gen.schedule.cpu import schedule_cpu

    b = tflite_tools.ModelBuilder()
    rng = np.random.default_rng(0)
    if reduction == "FULLY_CONNECTED":
        x, shape = b.input("x", [1, 13, 40]), [1, 13, 36]
        y = b.op(reduction, [x, b.const("w", rng.standard_normal((36, 40)).astype(np.float32) / 7),
                             b.const("b", np.zeros(36, np.float32))], shape, keep_num_dims=True)
    elif reduction == "CONV_2D":
        x, shape = b.input("x", [1, 7, 9, 16]), [1, 7, 9, 20]
        y = b.op(reduction, [x, b.const("w", rng.standard_normal((20, 3, 3, 16)).astype(np.float32) / 13),
                             b.const("b", np.zeros(20, np.float32))], shape, padding="SAME", stride_h=1, stride_w=1)
    else:
        x, shape = b.input("x", [1, 7, 9, 20]), [1, 7, 9, 20]
        y = b.op(reduction, [x, b.const("w", rng.standard_normal((1, 3, 3, 20)).astype(np.float32) / 3),
                             b.const("b", np.zeros(20, np.float32))], shape, padding="SAME", stride_h=1, stride_w=1,
                 depth_multiplier=1)
    b.output(b.op(op, [y], shape, **options))
    ops, kernel = only_block_kernel(b.build())
    traced = {f.name(): f for f in (kernel.values[id(ops[-1].outputs[0])].func, kernel.outputs[0][1].func)}

    def schedule_traced(k):
        schedule_cpu(k)
        for f in traced.values():
            f.trace_stores()

    jit = JitKernel(kernel, schedule=schedule_traced)
    capfd.readouterr()
    jit(jit.inputs_from({id(x): rng.standard_normal(x.shape).astype(np.float32)}))
    trace = capfd.readouterr()
    trace = trace.out + trace.err
    elements = int(np.prod(shape))
    counts = {name: _stores_per_element(trace, name) for name in traced}
    realised = {name: c for name, c in counts.items() if c}
    assert kernel.outputs[0][1].func.name() in realised, trace[:2000]
    for name, stored in realised.items():
        assert len(stored) == elements and set(stored.values()) == {1}, (name, len(stored), max(stored.values()))


def test_an_output_that_later_ops_read_is_computed_once_into_its_buffer():
    # A squeeze-excite's HARD_SWISH is a block output that the block's MEAN reads too: the MEAN
    # reads the output buffer, into which the activation is computed; no copy of it is realised
    # first (a pass more over the map: 2x XNNPACK's time on MobileNetV3's 14x14x240 blocks).
    from blockcheck import check_model_blocks
    from halide_gen.schedule.cpu import schedule_cpu

    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 6, 5, 40])
    h = b.op("HARD_SWISH", [x], [1, 6, 5, 40])
    b.output(h)
    b.output(b.op("MEAN", [h, b.const("axes", np.array([1, 2], np.int32))], [1, 1, 1, 40], keep_dims=True))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("se", ops, [ops[0].outputs[0], ops[1].outputs[0]])
    assert kernel.values[id(ops[0].outputs[0])].func is kernel.outputs[0][1].func
    schedule_cpu(kernel)
    assert f"produce {stable_name(kernel.op_values[0][0].func)} " not in lowered_stmt(kernel)
    assert check_model_blocks(model)


def _layer_norm(b, x, shape):
    """A converter's LayerNorm over the last axis of `x` (MEAN, SQUARED_DIFFERENCE, RSQRT, ...)."""
    rows = [*shape[:-1], 1]
    axis = b.const("axis", np.array([len(shape) - 1], np.int32))
    mean = b.op("MEAN", [x, axis], rows, keep_dims=True)
    variance = b.op("MEAN", [b.op("SQUARED_DIFFERENCE", [x, mean], list(shape)), axis], rows, keep_dims=True)
    scale = b.op("RSQRT", [b.op("ADD", [variance, b.const("eps", np.array([1e-5], np.float32))], rows)], rows)
    gamma = b.const("gamma", np.linspace(0.5, 1.5, shape[-1], dtype=np.float32))
    return b.op("MUL", [b.op("MUL", [b.op("SUB", [x, mean], list(shape)), scale], list(shape)), gamma], list(shape))


@pytest.mark.parametrize("case, shape, parallel", [
    ("softmax", (1, 4, 128, 128), True), ("softmax", (1, 4, 64, 64), False), ("layer_norm", (1, 4096, 32), True),
    ("residual_layer_norm", (1, 2048, 64), True), ("layer_norm", (1, 197, 192), False),
    ("softmax", (1, 3, 197, 197), True), ("layer_norm", (1, 256, 312), True)])
def test_a_row_wise_block_runs_every_stage_in_one_loop_over_row_tiles(case, shape, parallel):
    # A block of row statistics and the elementwise work reading them (softmax, LayerNorm, a
    # residual ADD kept as a block output before its LayerNorm) computes each tile of rows whole:
    # every stage inside the one loop over row tiles, shared among threads from 2^16 elements
    # (CpuParams.parallel_light_work). A stage at a time, each was a pass over the tensor and the
    # row totals ran on one thread: SegFormer's LayerNorms as slow at two threads as at one. Rows
    # of a length 16 does not divide (a ViT's 197 tokens, TinyBERT's 312) are folded in 16-lane
    # partials too, their last elements after: folded one at a time, they were a serial chain.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.cpu import schedule_cpu

    b = tflite_tools.ModelBuilder()
    x = b.input("x", list(shape))
    if case == "softmax":
        b.output(b.op("SOFTMAX", [x], list(shape), beta=1.0))
    elif case == "layer_norm":
        b.output(_layer_norm(b, x, shape))
    else:
        residual = b.op("ADD", [x, b.input("r", list(shape))], list(shape))
        b.output(residual)
        b.output(_layer_norm(b, residual, shape))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("rows", ops, [t for op in ops for t in op.outputs if t in model.main.outputs])
    schedule_cpu(kernel)
    stmt = lowered_stmt(kernel)
    # The one parallel loop's body is printed first, as a function of its own; with none, the
    # tile loop is the outer loop of the kernel's body.
    loops = re.findall(r"halide_do_par_for\(\(halide_task_t\)::(\w+),", stmt)
    statistics = [stable_name(r.partial.func) for r in kernel.row_reductions] + [stable_name(r.total.func) for r in kernel.row_reductions]
    assert statistics
    normalized = stable_name(kernel.outputs[-1][1].func)  # the residual sum, an output too, is a loop of its own
    if parallel:
        # A closure's name keeps the number Halide gave a repeated Func name ("f$2": "par_for_f_2_s0_"
        # or "par_for_f__2_s0_").
        (loop,) = [name for name in loops if re.search(f"par_for_{re.escape(normalized)}(_+\\d+)*_s0_", name)]
        body = stmt[stmt.index(f"func {loop} "):stmt.index("external_plus_metadata func")]
    else:
        assert not loops
        body = stmt[stmt.index(f"for ({normalized}.s0."):]
    for name in statistics:
        assert f"produce {name} " in body, name
    assert check_model_blocks(model)


@pytest.mark.parametrize("kernel_size", [1, 3])
def test_a_concatenation_a_pointwise_conv_reads_is_computed_per_pixel_tile(kernel_size):
    # SegFormer's head concatenates four 256-channel maps of 128 x 128 for a 1x1 conv: stored whole
    # first, 64 MB went to memory and back. A 1x1 stride-1 conv needs a tile's own pixels of it, all
    # of their channels: computed inside the conv's loop over pixel tiles, which every channel tile
    # then reads from L1. A 3x3 conv (a U-Net's decoder) reads neighbouring rows: stored whole, as before.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.cpu import schedule_cpu

    rng = np.random.default_rng(0)
    b = tflite_tools.ModelBuilder()
    x, y = b.input("x", [1, 16, 16, 32]), b.input("y", [1, 16, 16, 32])
    joined = b.op("CONCATENATION", [x, y], [1, 16, 16, 64], axis=3)
    w = b.const("w", rng.standard_normal((32, kernel_size, kernel_size, 64)).astype(np.float32))
    b.output(b.op("CONV_2D", [joined, w, b.const("bias", np.zeros(32, np.float32))], [1, 16, 16, 32],
                  padding="SAME", stride_h=1, stride_w=1, dilation_h_factor=1, dilation_w_factor=1))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("head", ops, [ops[1].outputs[0]])
    schedule_cpu(kernel)
    stmt = lowered_stmt(kernel)
    joined_func = stable_name(kernel.op_values[0][0].func)
    allocation = re.search(rf"allocate {re.escape(joined_func)}\[float32 \* 64 \* (\d+) ", stmt)
    if kernel_size == 1:
        body = stmt[:stmt.index("external_plus_metadata func")]  # the parallel loop's body, printed first
        assert f"produce {joined_func} " in body and int(allocation.group(1)) < 16, stmt[:3000]
    else:
        assert f"produce {joined_func} " not in stmt[:stmt.index("external_plus_metadata func")]
    assert check_model_blocks(model)


@pytest.mark.parametrize("rows, depth, channels, expected", [(4096, 64, 32, 342), (128, 312, 312, 20)])
def test_a_projection_to_few_channels_is_shared_among_threads_by_rows(rows, depth, channels, expected):
    # A FULLY_CONNECTED to 32 channels over 4096 tokens has one channel tile: shared by channel tiles
    # only, it ran on one thread (SegFormer's projections, as slow at two threads as at one); to 312
    # channels over 128 tokens it has 10, and two threads taking 5 each waited on the last whole one
    # (TinyBERT's FCs). Its row tiles go in groups, each a task: MATMUL_TASKS tasks at least (20
    # here: 10 channel tiles, 2 groups of row tiles), each group two row tiles at least. Weights
    # that fit L1 run every row tile as a task of its own.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.cpu import schedule_cpu

    rng = np.random.default_rng(0)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, rows, depth])
    w = b.const("w", rng.standard_normal((channels, depth)).astype(np.float32))
    b.output(b.op("FULLY_CONNECTED", [x, w, b.const("bias", np.zeros(channels, np.float32))], [1, rows, channels],
                  keep_num_dims=True))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("projection", ops, [ops[0].outputs[0]])
    schedule_cpu(kernel)
    tasks = [int(n) for n in re.findall(r"halide_do_par_for\(\(halide_task_t\)::\w+, 0, (\d+),", lowered_stmt(kernel))]
    assert tasks == [expected], tasks
    assert check_model_blocks(model)


@pytest.mark.parametrize("kind", ["dynamic_range", "int8"])
@pytest.mark.parametrize("family", ["arm", "x86"])
def test_a_dot_product_fully_connected_loads_its_weights_in_dense_vectors(kind, family):
    # A fully connected layer's dot-product weights are blocked by 32 channels (pack "dot4_blocked").
    # NEON's tile model chose 8-channel tiles for TinyBERT's dynamic-range FCs, and a tile starting at
    # 8 x t had each of its weight vectors' bytes addressed apart: a gather per load, 0.12 of the
    # A76's multiply-adds a cycle. Every vector read of every input must be one dense load, and on
    # NEON each row's 16 input bytes serve 4 dot-product groups (`sdot` by element): the reduction
    # loop steps 16 at a time.
    from halide_gen.schedule.params import NEON, X86
    from halide_gen.targets import target_spec
    from test_hybrid import _fc_model
    from test_lowering_int8 import fully_connected_model

    if kind == "dynamic_range":
        model = _fc_model((1, 18, 64), 40, per_channel=True, asymmetric=True, keep_num_dims=True)
    else:
        model = fully_connected_model(18, 64, 40)  # 40 channels over 18 rows: 8 x 9 tiles, as TinyBERT's
    target = "arm64-linux" if family == "arm" else "host"
    stmt = scheduled_stmt(model, NEON if family == "arm" else X86, target_spec(target).lowering_options())
    reads = re.findall(r"blk_in\d+\[([^\]]*)\]", stmt)
    vectors = [index for index in reads if re.search(r"ramp\(|x\d+\(|shuffle\(|concat_vectors\(", index)]
    assert vectors, "no vector reads"
    def dense(index: str) -> bool:  # one ramp of stride 1 over scalar terms
        return (index.startswith("ramp(") and index.count("ramp(") == 1
                and not re.search(r"shuffle\(|concat_vectors\(|x\d+\(", index)
                and re.search(r", 1, \d+\)( aligned\(\d+, \d+\))?$", index) is not None)

    assert all(dense(index) for index in vectors), [i for i in vectors if not dense(i)][:3]
    steps = {int(n) for n in re.findall(r"r\$x_o, 0, (\d+)\)", stmt)}
    assert steps == ({64 // 16} if family == "arm" else {64 // 4}), steps


def test_conv_tiles_cover_rows_without_a_one_pixel_tail():
    # x86 conv tiles: 7 pixels where 7 divides the row (MobileNets), 8 where 8 does (U-Nets), never
    # fewer than half the requested count.
    from halide_gen.schedule.tiles import whole_rows

    assert [whole_rows(w, 7) for w in (112, 56, 28, 14, 7)] == [7] * 5
    assert [whole_rows(w, 7) for w in (64, 32, 16, 8)] == [8] * 4
    assert all(4 <= whole_rows(w, 7) <= 8 for w in range(8, 300))


def _pointwise_then_3x3(hw: tuple[int, int], cin: int, mid: int, cout: int, seed: int):
    """A 1x1 conv (RELU6) then a 3x3 conv, SAME, on an hw map: random weights scaled to keep the
    activations near 1."""
    rng = np.random.default_rng(seed)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, *hw, cin])
    y = b.op("CONV_2D", [x, b.const("w0", rng.standard_normal((mid, 1, 1, cin)).astype(np.float32) / np.sqrt(cin)),
                         b.const("b0", rng.standard_normal(mid).astype(np.float32))], [1, *hw, mid],
             padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    b.output(b.op("CONV_2D", [y, b.const("w1", rng.standard_normal((cout, 3, 3, mid)).astype(np.float32)
                                         / np.sqrt(9 * mid)),
                              b.const("b1", rng.standard_normal(cout).astype(np.float32))], [1, *hw, cout],
                  padding="SAME", stride_h=1, stride_w=1))
    return b.build()


def test_rows_of_a_multiple_of_14_pixels_get_14_pixel_conv_tiles_and_stay_exact():
    # x86: 32 x 14 tiles where 14 divides the row (MobileNets' 112 / 56 / 28 / 14), the whole-row
    # tiles of 7 or 8 elsewhere; a 1x1 and a 3x3 conv on a 28-pixel row checked against LiteRT.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.params import X86
    from halide_gen.schedule.tiles import tile_shape

    model = _pointwise_then_3x3((3, 28), 16, 40, 24, seed=14)
    ops = model.main.operators
    kernel = build_block("rows", ops, [ops[1].outputs[0]])
    shapes = [tile_shape(acc, X86, X86.conv_channels, X86.conv_pixels, True, 1, modelled=True)
              for acc in kernel.accumulators]
    assert shapes == [(32, 14), (32, 14)]
    assert check_model_blocks(model)


def test_a_tile_keeps_its_pixels_out_of_one_l1_set():
    # x86 L1 sets span 4 KB with 8 ways: reads 4 KB apart (rows of 1024 floats) fill one set by 8
    # of them, 4000 bytes apart they spread over the sets; 2 KB apart, 16 fit.
    from halide_gen.schedule.params import NEON, X86
    from halide_gen.schedule.tiles import pixels_in_l1_sets

    assert pixels_in_l1_sets(X86, 4096, 8) and not pixels_in_l1_sets(X86, 4096, 9)
    assert pixels_in_l1_sets(X86, 4000, 14) and pixels_in_l1_sets(X86, 2048, 16)
    assert not pixels_in_l1_sets(X86, 2048, 17) and not pixels_in_l1_sets(X86, 8192, 12)
    assert pixels_in_l1_sets(X86, 0, 64) and pixels_in_l1_sets(NEON, 4096, 64)  # unknown / not modelled


def _fc_then_pointwise(rows: int, depth: int, seed: int):
    """A fully connected layer over `depth` inputs, then a 1x1 conv over `depth` channels on one
    14-pixel row: random weights scaled to keep the activations near 1."""
    rng = np.random.default_rng(seed)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, rows, depth])
    b.output(b.op("FULLY_CONNECTED", [x, b.const("w0", rng.standard_normal((32, depth)).astype(np.float32)
                                                 / np.sqrt(depth)),
                                      b.const("b0", rng.standard_normal(32).astype(np.float32))], [1, rows, 32],
                  keep_num_dims=True))
    m = b.input("m", [1, 1, 14, depth])
    b.output(b.op("CONV_2D", [m, b.const("w1", rng.standard_normal((32, 1, 1, depth)).astype(np.float32)
                                         / np.sqrt(depth)),
                              b.const("b1", rng.standard_normal(32).astype(np.float32))], [1, 1, 14, 32],
                  padding="SAME", stride_h=1, stride_w=1))
    return b.build()


@pytest.mark.parametrize("depth, fc_rows, conv_pixels", [(1024, 8, 7), (1000, 12, 14)])
def test_rows_4_kb_apart_get_fewer_rows_per_register_tile_and_stay_exact(depth, fc_rows, conv_pixels):
    # x86: a 32 x 12 FC tile over rows of 1024 floats put its 12 rows in one 8-way L1 set (bert's and
    # GPT-2's FCs 1024 -> 256: 0.89 ms against 0.61 with 1000 inputs, on Zen 4); it takes 8 rows, and
    # a 1x1 conv over 1024 channels 7-pixel tiles instead of 14 (14x14 maps: 1.78 -> 1.01 ms). 1000
    # inputs keep the default tiles. Both blocks exact against LiteRT.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.params import X86
    from halide_gen.schedule.tiles import tile_shape

    model = _fc_then_pointwise(24, depth, seed=4)
    shapes = []
    for op in model.main.operators:
        (acc,) = build_block("rows", [op], [op.outputs[0]]).accumulators
        shapes.append(tile_shape(acc, X86, X86.conv_channels, X86.mm_rows if op.name == "FULLY_CONNECTED"
                                  else X86.conv_pixels, True, 1, modelled=True))
    assert shapes == [(32, fc_rows), (32, conv_pixels)]
    assert check_model_blocks(model)


@pytest.mark.parametrize("hw, rows", [((2, 2), 2), ((4, 4), 2)])
def test_a_conv_on_a_tiny_map_takes_bands_of_rows_in_one_register_tile(hw, rows):
    # x86: a map of at most 16 pixels is tiled in bands of rows, so each weight is read once per
    # band, not once per row: a 2x2 map (MobileNetV1 on 64x64 ends in one; its 1024 -> 1024 1x1
    # conv: 1.95x -> 1.0x XNNPACK) is one band; a 4x4 map's 32-channel tiles take two rows (16
    # accumulators, not 8: MobileNetV3-Large's 4x4 blocks 10-20% faster). The accumulators stay
    # within the budget; exact against LiteRT.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import schedule_cpu

    model = _pointwise_then_3x3(hw, 96, 128, 40, seed=9)
    ops = model.main.operators
    kernel = build_block("tiny", ops, [ops[1].outputs[0]])
    schedule_cpu(kernel)
    stmt = lowered_stmt(kernel)
    tiles = re.findall(rf"allocate \w*conv_2d_acc\[float32 \* (\d+) \* {hw[1]} \* {rows}\b", stmt)
    # (Both convolutions' accumulators; a stmt may hold one more copy of each for a tail.)
    assert len(tiles) >= 2 and all(int(c) * hw[1] * rows // 16 <= 28 for c in tiles), tiles
    if hw == (4, 4):
        assert set(tiles) == {"32"}, tiles  # whole packed slabs of channels, two rows each
    assert check_model_blocks(model)


def test_weights_beyond_the_cache_keep_channel_tiles_outside_the_rows_and_short_rows_are_one_tile():
    # x86: a conv whose weights outgrow CpuParams.weight_cache_bytes walks its output-channel tiles
    # outermost, each tile's weights reused by every row (Xception's 728 -> 728 1x1 convs: 1.49x ->
    # 1.03x XNNPACK); a row of 9 pixels (at most conv_row_pixels) is one tile, not 5 + 4 (its 9x9
    # maps: 1.39x -> 1.05x). Both blocks exact against LiteRT under those parameters.
    import dataclasses

    from blockcheck import check_model_blocks
    from halide_gen.schedule import schedule_cpu
    from halide_gen.schedule.params import X86

    params = dataclasses.replace(X86, weight_cache_bytes=64 << 10)  # the 3x3 conv's 184 KB outgrow it
    model = _pointwise_then_3x3((5, 9), 96, 128, 40, seed=5)
    ops = model.main.operators
    kernel = build_block("big", ops, [ops[1].outputs[0]])
    schedule_cpu(kernel, params)
    text = lowered_stmt(kernel)
    assert set(re.findall(r"allocate \w*conv_2d_acc\[float32 \* \d+ \* (\d+) ", text)) == {"9"}
    # The output's channel tiles are its parallel tasks, each looping over the rows.
    out = stable_name(kernel.outputs[0][1].func)
    tasks = {m.group(1): m.group(0) for m in re.finditer(r"internal func (\S+) \((?:.*\n)*?\}\n", text)}
    # (A closure's name may end in "__1": Halide numbers repeats within a process.)
    assert any(re.search(r"_s0_c_c_o(?:__\d+)?$", name) and f"for ({out}.s0.y, 0, 5)" in body
               for name, body in tasks.items()), \
        list(tasks)
    assert check_model_blocks(model, params=params)


@pytest.mark.parametrize("params_name", ["X86", "NEON"])
def test_concatenated_channels_are_copied_a_whole_vector_from_one_input(params_name):
    # The zero-padded copy of a CONCATENATION a 3x3 conv reads (U-Net's decoder): its few channel
    # vectors are unrolled (schedule.params.UNROLLED_CHANNELS), so each takes one input's channels in
    # dense loads, never a select between both (unet_small's 128x128 concat + conv: 1.24x -> 0.95x
    # XNNPACK's time); and the block stays exact.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import params as cpu_params
    from halide_gen.schedule import schedule_cpu

    params = getattr(cpu_params, params_name)
    b = tflite_tools.ModelBuilder()
    a, c = b.input("a", [1, 9, 9, 16]), b.input("c", [1, 9, 9, 16])
    x = b.op("CONCATENATION", [a, c], [1, 9, 9, 32], axis=3)
    w = np.random.default_rng(0).standard_normal((16, 3, 3, 32)).astype(np.float32)
    b.output(b.op("CONV_2D", [x, b.const("w", w), b.const("b", np.zeros(16, np.float32))], [1, 9, 9, 16],
                  padding="SAME", stride_h=1, stride_w=1))
    model = b.build()
    kernel = build_block("cat", model.main.operators, model.main.outputs)
    schedule_cpu(kernel, params)
    stmt = lowered_stmt(kernel)
    padded = stable_name(kernel.op_helpers[1][0].func)
    copy = stmt[stmt.index(f"produce {padded} {{"):stmt.index(f"consume {padded} {{")]
    inputs = [stable_name(arg.param) for arg in kernel.arguments if arg.tensor in (a, c)]
    assert "select(" not in copy and len(inputs) == 2 and all(f"{i}[ramp(" in copy for i in inputs)
    check_model_blocks(model, params=params)


def test_a_concatenation_and_its_scaled_copy_are_cut_where_their_sources_meet():
    # DenseNet: CONCATENATION (a block output: the next one reads it), a per-channel MUL + RELU
    # materialised for a 1x1 conv. Both the output and the MUL take each vector from one source, not
    # a gather from each and a select (the concatenation alone 10.9x -> 1.2x XNNPACK, the block 1.61x
    # -> 1.00x); exact against LiteRT.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import schedule_cpu

    rng = np.random.default_rng(4)
    b = tflite_tools.ModelBuilder()
    a, c = b.input("a", [1, 4, 4, 160]), b.input("c", [1, 4, 4, 32])
    x = b.op("CONCATENATION", [a, c], [1, 4, 4, 192], axis=3)
    y = b.op("MUL", [x, b.const("s", rng.standard_normal((1, 1, 1, 192)).astype(np.float32))], [1, 4, 4, 192],
             fused_activation_function="RELU")
    w = rng.standard_normal((64, 1, 1, 192)).astype(np.float32) / 14
    b.output(x, b.op("CONV_2D", [y, b.const("w", w), b.const("b", np.zeros(64, np.float32))], [1, 4, 4, 64],
                     padding="VALID", stride_h=1, stride_w=1))
    model = b.build()
    kernel = build_block("dense", model.main.operators, model.main.outputs)
    schedule_cpu(kernel)
    stmt = lowered_stmt(kernel)
    for f in (kernel.outputs[0][1].func, kernel.op_values[1][0].func):
        body = stmt[stmt.index(f"produce {stable_name(f)} {{"):]
        body = body[:body.index("consume ")] if "consume " in body else body
        assert "select(ramp(" not in body, stable_name(f)
    assert check_model_blocks(model)


def _hot_loop(asm: str, mnemonic: str = "fmla") -> list[str]:
    """The mnemonics of the assembly loop with the most `mnemonic` (a label up to the branch back to it)."""
    best, loop, label = [], None, None
    for line in asm.splitlines():
        words = line.split("//")[0].split()
        if not words:
            continue
        if words[0].startswith(".LBB") and words[0].endswith(":"):
            loop, label = [], words[0][:-1]
        elif loop is not None and not words[0].startswith("."):
            loop.append(words[0])
            if words[0].startswith("b") and words[-1] == label:
                best = max(best, loop, key=lambda instructions: instructions.count(mnemonic))
                loop = None
    return best


def _neon_hot_loop(tmp_path, model, mnemonic="fmla"):
    from halide_gen.aot import compile_kernel

    sg = model.main
    art = compile_kernel(sg.operators, sg.outputs, "arm64-linux", cache_dir=tmp_path, emit_asm=True)
    return _hot_loop("".join(p.read_text() for p in art.extra if p.suffix == ".s"), mnemonic)


def test_neon_matrix_products_load_a_tiles_weights_in_pairs(tmp_path):
    # A 16-channel NEON register tile reads its four weight vectors from one base address, so they
    # load as two `ldp` per reduction step; with `(16 t + 4) % 32` in the address each vector had a
    # base of its own (ldr / ldur, and an add more), and the loop ran 4 steps per iteration, not 8
    # (CpuParams.reduce_groups_unrolled): gpt2_small's FC loop had 22 instructions besides its 80
    # fmla, now 29 besides 160 (XNNPACK's 6x8 kernel: 12 besides 48).
    b = tflite_tools.ModelBuilder()
    rng = np.random.default_rng(0)
    x = b.input("x", [1, 20, 64])
    w = b.const("w", rng.standard_normal((64, 64)).astype(np.float32))
    b.output(b.op("FULLY_CONNECTED", [x, w, None], [1, 20, 64], keep_num_dims=True))
    loop = _neon_hot_loop(tmp_path, b.build())
    fmla = loop.count("fmla")
    assert fmla >= 64 and "ldur" not in loop, loop
    assert len(loop) - fmla <= 0.2 * fmla, loop


def test_neon_3x3_convolutions_keep_their_tile_in_registers(tmp_path):
    # Inside a 3x3 conv's taps the loop over input-channel groups is not unrolled: LLVM loaded both
    # groups' inputs at once and spilled accumulators to the stack inside the loop (str / reload).
    from test_lowering import conv_model

    loop = _neon_hot_loop(tmp_path, conv_model((1, 6, 40, 16), 16, 3, 1, "SAME"))
    assert loop.count("fmla") >= 64 and "str" not in loop and "mov" not in loop, loop


def test_neon_elementwise_outputs_take_several_vectors_per_step(tmp_path):
    # A squeeze-excite MUL over 144 channels: 4 NEON vectors per loop iteration (CpuParams.
    # elementwise_vectors), loaded and stored in pairs, not one vector and a loop branch each.
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 4, 4, 144])
    gate = b.input("gate", [1, 1, 1, 144])
    b.output(b.op("MUL", [x, gate], [1, 4, 4, 144]))
    loop = _neon_hot_loop(tmp_path, b.build(), "fmul")
    assert loop.count("fmul") == 4 and loop.count("stp") == 2, loop


def test_neon_gelu_before_a_matrix_product_runs_four_vectors_a_step_with_no_nan_test(tmp_path):
    # bert's GELU, materialised once before the FC that reads it (materialize_prologue), takes 4
    # vectors per loop iteration as a block output does, with no NaN test of its own: NaN carries
    # through erf's clamp and products. It took 34 instructions a vector (a loop of one, fabs / cmhi /
    # bif, a multiply by 1/sqrt(2)); now about 25.
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [4, 512])
    g = b.op("GELU", [x], [4, 512])
    w = b.const("w", np.ones((16, 512), np.float32))
    b.output(b.op("FULLY_CONNECTED", [g, w, None], [8, 16]))
    loop = _neon_hot_loop(tmp_path, b.build(), "fdiv")
    assert loop.count("fdiv") == 4 and "bif" not in loop and "bsl" not in loop and len(loop) <= 27 * 4, loop


@pytest.mark.parametrize("op, mnemonic", [("LOGISTIC", "fdiv"), ("SOFTMAX", "fmla")])
def test_neon_exponentials_carry_nan_with_no_test_of_their_own(tmp_path, op, mnemonic):
    # exp of a non-positive value (a sigmoid's, a softmax's) lets NaN through its floor (ieee.at_least)
    # and arithmetic, so neither op tests its input's bits for NaN (an and, `cmhi` and `bif` a vector
    # on NEON; efficientnet_b0's swish blocks: 0.922 -> 0.899 XNNPACK's instructions without them).
    # tests/test_special_values.py holds the NaN results to LiteRT's.
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 8, 8, 64])
    b.output(b.op(op, [x], [1, 8, 8, 64], **({"beta": 1.0} if op == "SOFTMAX" else {})))
    loop = _neon_hot_loop(tmp_path, b.build(), mnemonic)
    assert loop.count(mnemonic) and "cmhi" not in loop, loop


def test_a_wide_concatenation_is_copied_zero_padded_part_by_part(tmp_path):
    # U-Net's decoder concatenates 64 + 64 channels and pads them for a 3x3 conv. Past 64 channels the
    # copy's channel loop is not unrolled, so each vector selected between a gather from either
    # input (a lane at a time: 35 instructions a vector on NEON); split where the inputs meet
    # (Value.joins), each part is a dense copy, several vectors a step.
    from halide_gen.aot import compile_kernel

    b = tflite_tools.ModelBuilder()
    x, y = b.input("x", [1, 8, 8, 64]), b.input("y", [1, 8, 8, 64])
    joined = b.op("CONCATENATION", [x, y], [1, 8, 8, 128], axis=3)
    w = b.const("w", np.ones((16, 3, 3, 128), np.float32))
    b.output(b.op("CONV_2D", [joined, w, None], [1, 8, 8, 16], padding="SAME"))
    sg = b.build().main
    art = compile_kernel(sg.operators, sg.outputs, "arm64-linux", cache_dir=tmp_path, emit_asm=True)
    asm = "".join(p.read_text() for p in art.extra if p.suffix == ".s")
    lanes = [line for line in asm.splitlines() if line.split()[:1] == ["ld1"] and "}[" in line]
    assert not lanes, lanes[:4]


def test_neon_batch_matmul_loads_four_steps_of_a_row_at_once(tmp_path):
    # BATCH_MATMUL's left operand, read at the output's own rows, is a reduction source as a fully
    # connected layer's input is: one vector load serves 4 `fmla` by element. Read one float per
    # step (ldr s / ld1r) bert_small's attention products took 1.01x XNNPACK's instructions.
    b = tflite_tools.ModelBuilder()
    lhs, rhs = b.input("a", [1, 4, 20, 64]), b.input("b", [1, 4, 64, 64])
    b.output(b.op("BATCH_MATMUL", [lhs, rhs], [1, 4, 20, 64]))
    loop = _neon_hot_loop(tmp_path, b.build())
    fmla, single = loop.count("fmla"), loop.count("ldr") + loop.count("ld1r")
    assert fmla >= 64 and single <= 0.2 * fmla, loop


@pytest.mark.parametrize("params_name, op, depth, steps",
                         [("NEON", "BATCH_MATMUL", 26, 2), ("NEON", "BATCH_MATMUL", 18, 2), ("NEON", "BATCH_MATMUL", 7, 1),
                          ("NEON", "BATCH_MATMUL", 12, 4), ("NEON", "CONV_2D", 10, 1), ("NEON", "CONV_2D", 12, 4),
                          ("NEON_FP16", "BATCH_MATMUL", 26, 1), ("NEON_FP16", "BATCH_MATMUL", 64, 8)])
def test_a_products_steps_per_load_are_the_most_that_divide_its_depth(params_name, op, depth, steps):
    # TinyBERT's attention heads of 26: four steps per vector load do not divide them, and every
    # step was a broadcast load beside the tile's fmla (20 of 30 instructions); two steps per 64-bit
    # load now (the whole attention block 0.969 -> 0.941 XNNPACK's ARM64 instructions). Convolutions
    # keep one (a squeeze-excite conv 10 deep gained nothing), and in half precision a load stays a
    # whole register or one step (half of one went through the stack).
    from halide_gen.schedule import params as cpu_params

    b = tflite_tools.ModelBuilder()
    if op == "BATCH_MATMUL":
        lhs, rhs = b.input("a", [1, 2, 20, depth]), b.input("b", [1, 2, depth, 64])
        b.output(b.op("BATCH_MATMUL", [lhs, rhs], [1, 2, 20, 64]))
    else:
        w = b.const("w", np.ones((64, 1, 1, depth), np.float32))
        b.output(b.op("CONV_2D", [b.input("x", [1, 4, 5, depth]), w, b.const("bias", np.zeros(64, np.float32))],
                      [1, 4, 5, 64], padding="VALID", stride_h=1, stride_w=1))
    stmt = scheduled_stmt(b.build(), getattr(cpu_params, params_name))
    name = "batch_matmul" if op == "BATCH_MATMUL" else "conv_2d"
    loops = re.findall(rf"for \(\w*{name}_acc\.s1\.[\w$.]*?(_o)?, 0, (\d+)\)", stmt)
    assert loops and all(int(n) == depth // steps and bool(split) == (steps > 1) for split, n in loops), loops


@pytest.mark.parametrize("params_name, channels, own_func",
                         [("NEON", 26, False), ("NEON", 26, True), ("NEON", 18, True), ("X86", 40, False)])
def test_a_plain_products_last_channel_tile_shifts_back_instead_of_running_guarded(params_name, channels, own_func):
    # TinyBERT's weights x values over heads of 26: a tile of 16 channels and a guarded one of 10,
    # whose vectors went through predicated stores and a stack copy of each step's inputs (8 loops
    # of about 10 fmla in 40 instructions). With no epilogue, the last tile shifts back over
    # channels its neighbour computes (nothing elementwise runs twice): every tile whole, no guard
    # (the attention block 0.90 -> 0.79 XNNPACK's A76 instructions). Exact against LiteRT on the
    # host's JIT with either CPU's parameters; the product as a block output (its copy) and as a
    # Func of its own (read again by a TRANSPOSE, as in TinyBERT).
    from blockcheck import check_model_blocks
    from halide_gen.schedule import params as cpu_params

    params = getattr(cpu_params, params_name)
    b = tflite_tools.ModelBuilder()
    p, v = b.input("p", [1, 2, 20, 32]), b.input("v", [1, 2, 32, channels])
    y = b.op("BATCH_MATMUL", [p, v], [1, 2, 20, channels])
    if own_func:
        y = b.op("TRANSPOSE", [y, b.const("perm", np.array([0, 2, 1, 3], np.int32))], [1, 20, 2, channels])
    b.output(y)
    model = b.build()
    stmt = scheduled_stmt(model, params)
    # A guarded tile: its stores from the accumulator predicated, or under an `if` of their own.
    guards = [line for line in stmt.splitlines()
              if ("batch_matmul_acc[" in line and " if (" in line) or re.fullmatch(r"\s*if \(t\d+\) \{", line)]
    assert not guards, guards[:4]
    check_model_blocks(model, params=params)


def test_a_softmaxs_exponentials_and_scaling_run_several_vectors_a_step_on_neon():
    # Intermediate stages run one vector a loop step (a sigmoid's constants spill unrolled); a
    # softmax's exponentials and its scaling keep few values live (Value.unrollable), so inside an
    # attention core they take CpuParams.elementwise_vectors a step as block outputs do: over 128
    # keys 32 + 6 instructions a vector were 28.5 + 2.75.
    from halide_gen.schedule.params import NEON

    b = tflite_tools.ModelBuilder()
    probs = b.op("SOFTMAX", [b.input("x", [1, 2, 16, 128])], [1, 2, 16, 128], beta=1.0)
    b.output(b.op("BATCH_MATMUL", [probs, b.input("v", [1, 2, 128, 16])], [1, 2, 16, 16]))
    stmt = scheduled_stmt(b.build(), NEON)
    for stage in ("softmax_exp", "softmax"):
        assert re.search(rf"for \(\w*_{stage}\.s0\.c\.c_steps, 0, 8\)", stmt), stage


def test_a_row_reductions_partial_sums_run_in_one_loop_on_neon(tmp_path):
    # A MEAN over 64 values takes 16 partial sums per row: one vector of 16 lanes (4 NEON registers)
    # whose inline sum runs one loop with 4 accumulators, not one loop per register.
    from halide_gen.aot import compile_kernel

    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 8, 64])
    b.output(b.op("MEAN", [x, b.const("axis", np.array([2], np.int32))], [1, 8, 1], keep_dims=True))
    sg = b.build().main
    art = compile_kernel(sg.operators, sg.outputs, "arm64-linux", cache_dir=tmp_path, emit_asm=True)
    stmt = "".join(compiled_stmts(art))
    assert sum("for (sum" in line and "_ro$x" in line for line in stmt.splitlines()) == 1


@pytest.mark.parametrize("op", ["SOFTMAX", "LOG_SOFTMAX", "MEAN", "SUM", "L2_NORMALIZATION"])
def test_a_row_reduction_on_x86_keeps_its_chains_apart_in_one_loop_and_folds_in_pairs(tmp_path, op):
    # x86 keeps 4 chains of partial sums (or maxima) per row, as one 64-lane vector in one loop, not a
    # loop per chain: those ran one after another, each as long as the single chain they replaced.
    # The chains, the row's whole vectors past the last step and then its 16 lanes and last
    # elements fold in pairs, not one at a time through a loop (a [128, 576] RMSNorm: 13.3 -> 9.9
    # us, XNNPACK 15.5). 1000 = 15 x 64 + 2 x 16 + 8 takes every stage.
    from halide_gen.aot import compile_kernel

    b = tflite_tools.ModelBuilder()
    x = b.input("x", [3, 1000])
    if op in ("MEAN", "SUM"):
        b.output(b.op(op, [x, b.const("axis", np.array([1], np.int32))], [3, 1], keep_dims=True))
    else:
        b.output(b.op(op, [x], [3, 1000], **({"beta": 1.0} if op == "SOFTMAX" else {})))
    sg = b.build().main
    art = compile_kernel(sg.operators, sg.outputs, "host", cache_dir=tmp_path, emit_asm=True)
    stmts = compiled_stmts(art)
    assert stmts
    for stmt in stmts:
        partials = set(re.findall(r"allocate (\w+_partial)\[float32 \* 64\b", stmt))
        assert partials, stmt
        assert sum("for (" in line and "_ro$x" in line for line in stmt.splitlines()) == len(partials)
        assert not re.search(r"for \(\S*_r[lg]\$x", stmt)


@pytest.mark.parametrize("case", ["squeeze", "gemv"])
def test_a_register_tile_of_few_accumulators_keeps_interleaved_partial_sums(case):
    # x86: a tile of fewer accumulator vectors than CpuParams.min_chains (FMA latency x pipes) waits
    # on each FMA's result: a squeeze-excite conv (96 -> 4 channels on one pixel, then swish) is one
    # vector, a matrix-vector product 2. Each keeps interleaved partial sums along its reduction
    # (rfactor), added once at the end; the squeeze's one pixel is one vector of its 4 channels, not
    # a scalar epilogue per channel. Exact against LiteRT.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import schedule_cpu
    from halide_gen.schedule.register_tile import interleaved_chains

    rng = np.random.default_rng(4)
    b = tflite_tools.ModelBuilder()
    if case == "squeeze":
        x = b.input("x", [1, 1, 1, 96])
        conv = b.op("CONV_2D", [x, b.const("w", (rng.standard_normal([4, 1, 1, 96]) * 0.1).astype(np.float32)),
                                b.const("b", np.zeros(4, np.float32))], [1, 1, 1, 4], padding="SAME",
                    stride_w=1, stride_h=1)
        b.output(b.op("MUL", [conv, b.op("LOGISTIC", [conv], [1, 1, 1, 4])], [1, 1, 1, 4]))
    else:
        x = b.input("x", [1, 512])
        b.output(b.op("FULLY_CONNECTED", [x, b.const("w", (rng.standard_normal([24, 512]) * 0.05).astype(np.float32)),
                                          None], [1, 24]))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("few", ops, [ops[-1].outputs[0]])
    (acc,) = kernel.accumulators
    deepest = acc.extents.index(max(acc.extents))  # the input channels
    assert interleaved_chains(acc, X86_PARAMS, deepest, 1) == 8
    assert interleaved_chains(acc, X86_PARAMS, deepest, 8) == 1
    schedule_cpu(kernel)
    text = lowered_stmt(kernel)
    assert re.search(r"allocate \w*_intm\[float32 \* \d+( \* 1)* \* [48]\]", text), text
    assert not re.search(r"blk_0\[\d\] = ", text) and not re.search(r"few\w*\[\d\] = ", text)
    assert check_model_blocks(model)


@pytest.mark.parametrize("queries", [50, 77, 128, 197, 256, 300, 384, 512, 1024])
def test_attention_row_tiles_divide_the_queries_where_a_size_near_the_most_does(queries):
    # A last row tile of fewer rows makes every tile's stages loops of a run-time length: 12 rows ran
    # 512 queries 1.23x XNNPACK's time, 8 rows 0.82x; 50 and 77 queries in 8-row tiles 1.4-1.6x.
    from halide_gen.schedule.attention import query_tile_rows
    from halide_gen.schedule.params import X86

    rows = query_tile_rows(queries, X86.attention_rows)
    dividing = [r for r in range(X86.attention_rows // 2, X86.attention_rows + 1) if queries % r == 0]
    assert rows == (max(dividing) if dividing else X86.attention_rows)


@pytest.mark.parametrize("params_name", ["X86", "NEON"])
@pytest.mark.parametrize("tiled", [False, True])
def test_an_attention_core_is_one_exact_kernel_tiled_by_query_rows_past_its_family_threshold(
        tiled, params_name):
    # Scores, scale, causal mask, softmax and weights x values in one kernel (fusion.table3's
    # attention exception). Scores of at most params.attention_whole_bytes are computed whole, a stage
    # at a time; larger ones a tile of query rows at a time, where the second product reads them: the
    # scores' buffer holds one tile's rows (a tail tile among the 40), never the whole matrix. Exact
    # against LiteRT's reference kernels either way.
    import dataclasses

    from blockcheck import check_model_blocks
    from graphgen import attention_ops
    from halide_gen.schedule import params as cpu_params

    params = dataclasses.replace(getattr(cpu_params, params_name), attention_whole_bytes=0 if tiled else 1 << 20)
    rows = 40
    b = tflite_tools.ModelBuilder()
    q, k, v = (b.input(n, [1, 2, rows, 8]) for n in "qkv")
    b.output(attention_ops(b, q, k, v, np.triu(np.full((rows, rows), -1e9, np.float32), 1)[None, None]))
    model = b.build()
    scores = set(re.findall(r"allocate \w*op0_batch_matmul\[float32 \* (\d+) \* (\d+)",
                            scheduled_stmt(model, params)))
    # (Its rows: the second product's register tile, params.attention_rows on x86, modelled on NEON.)
    assert len(scores) == 1 and all(int(keys) == rows and (int(r) < rows if tiled else int(r) == rows)
                                    for keys, r in scores), scores
    assert check_model_blocks(model, params=params) == {"attention core": 1}  # the roofline plan fuses it whole



def test_an_attention_core_whose_keys_and_values_outgrow_the_weight_cache_is_computed_a_stage_at_a_time():
    # Each row tile re-reads its head's keys and values whole: past CpuParams.weight_cache_bytes (a
    # Gemma head of 256 over 1024 keys, 2 MB) the stages one at a time were faster. Here 40 keys x
    # (8 + 8) x 4 bytes = 2560 against a cache of 2048, 2560 and 4096: whole scores in the first only.
    import dataclasses

    from blockcheck import check_model_blocks
    from graphgen import attention_ops
    from halide_gen.schedule.params import X86

    rows = 40
    b = tflite_tools.ModelBuilder()
    q, k, v = (b.input(n, [1, 2, rows, 8]) for n in "qkv")
    b.output(attention_ops(b, q, k, v, np.triu(np.full((rows, rows), -1e9, np.float32), 1)[None, None]))
    model = b.build()
    for cache, whole in ((2048, True), (2560, False), (4096, False)):
        params = dataclasses.replace(X86, attention_whole_bytes=0, weight_cache_bytes=cache)
        scores = set(re.findall(r"allocate \w*op0_batch_matmul\[float32 \* (\d+) \* (\d+)",
                                scheduled_stmt(model, params)))
        assert len(scores) == 1 and all((int(r) == rows) == whole for _, r in scores), (cache, scores)
    assert check_model_blocks(model, params=params) == {"attention core": 1}

def test_query_rows_no_tile_divides_are_tiles_of_one_size_the_last_shifted_back():
    # Grouped-query attention with each key/value head's query heads on its rows (2 x 23 = 46 rows
    # per key/value head here, 788 for 4 x 197): no tile of 6-12 rows divides them. A shorter last
    # tile of each head made the tile's stages loops of a run-time length (or a second copy of every
    # loop) and ran GQA at 197 tokens 1.08-1.40x XNNPACK's time; the last tile now shifts back over
    # rows its neighbour computes, so every tile's loops run 12 rows. Exact against LiteRT.
    import dataclasses

    from blockcheck import check_model_blocks
    from graphgen import attention_ops
    from halide_gen.schedule.params import X86

    params = dataclasses.replace(X86, attention_whole_bytes=0)
    tokens, group = 23, 2
    b = tflite_tools.ModelBuilder()
    q = b.input("q", [1, 2, group * tokens, 8])
    k, v = (b.input(n, [1, 2, tokens, 8]) for n in "kv")
    mask = np.tile(np.triu(np.full((tokens, tokens), -1e9, np.float32), 1), (group, 1))[None, None]
    b.output(attention_ops(b, q, k, v, mask))
    model = b.build()
    rows = re.findall(r"for \(\w*softmax\w*\.s0\.x\.rebased, 0, (\S+)\)", scheduled_stmt(model, params))
    assert rows and set(rows) == {str(X86.attention_rows)}, rows
    assert check_model_blocks(model, params=params) == {"attention core": 1}


@pytest.mark.parametrize("params_name", ["X86", "NEON"])
@pytest.mark.parametrize("core", [True, False])
def test_keys_read_transposed_from_the_block_input_are_stored_transposed_once(core, params_name):
    # softmax(Q K^T / 8 + padding mask) V with K read through adj_y straight from the block's input,
    # as converters write GPT-2's and BERT's attention: every step of the scores' product gathered
    # its vector of keys at a stride of the head's depth (1.3x XNNPACK's time at 128 tokens, 12 heads
    # of 64). K is now stored transposed once (schedule.register_tile.transposed_block_input) and the
    # product reads it in dense vectors. Exact against LiteRT's reference kernels.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import schedule_cpu
    from halide_gen.schedule import params as cpu_params

    params = getattr(cpu_params, params_name)
    rows, depth = 40, 24
    b = tflite_tools.ModelBuilder()
    q, k, v = (b.input(n, [1, 2, rows, depth]) for n in "qkv")
    mask = b.input("mask", [1, 1, 1, rows])
    scores = b.op("BATCH_MATMUL", [q, k], [1, 2, rows, rows], adj_y=True)
    if core:
        scaled = b.op("MUL", [scores, b.const("scale", np.float32([depth ** -0.5]))], scores.shape)
        weights = b.op("SOFTMAX", [b.op("ADD", [scaled, mask], scores.shape)], scores.shape, beta=1.0)
        b.output(b.op("BATCH_MATMUL", [weights, v], [1, 2, rows, depth]))
    else:  # the scores alone: the matrix-product template
        b.output(scores)
    model = b.build()
    ops, kernel = only_block_kernel(model)
    assert len(ops) == (5 if core else 1)  # the padding mask's broadcast ADD keeps the core one block (fusion.table3)
    schedule_cpu(kernel, params)
    stmt = lowered_stmt(kernel)
    keys = next(stable_name(a.param) for a in kernel.arguments if a.tensor is k)
    products = [line for line in stmt.splitlines()
                if re.search(r"op0_batch_matmul_acc\[", line) and " = " in line]
    assert products and not any(f"{keys}[" in line for line in products)
    assert any(re.search(rf"{keys}_clamped\[ramp\([^\n]*, 1, {params.lanes}\)", line) for line in products)
    check_model_blocks(model, params=params)


def test_a_conv_with_few_output_channels_runs_its_epilogue_on_vectors_of_pixels():
    # x86: a 1x1 conv to 2 channels + LOGISTIC (U-Net's segmentation head) took its register tile
    # over channels, so the sigmoid ran on 2 of 16 lanes (157 us against XNNPACK's 97 on 128x128);
    # over vectors of pixels, the 2 channels unrolled, each store writes 16 pixels' channels
    # interleaved (91 us). Exact against LiteRT.
    from blockcheck import check_model_blocks
    from halide_gen.schedule import schedule_cpu

    rng = np.random.default_rng(2)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 16, 16, 8])
    y = b.op("CONV_2D", [x, b.const("w", rng.standard_normal((2, 1, 1, 8)).astype(np.float32)),
                         b.const("b", rng.standard_normal(2).astype(np.float32))], [1, 16, 16, 2],
             padding="SAME", stride_h=1, stride_w=1)
    b.output(b.op("LOGISTIC", [y], [1, 16, 16, 2]))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("few", ops, [ops[-1].outputs[0]])
    schedule_cpu(kernel)
    stmt = lowered_stmt(kernel)
    out = stable_name(kernel.outputs[0][1].func)
    stores = [line for line in stmt.splitlines() if line.strip().startswith(f"{out}[")]
    assert stores and all("interleave_vectors" in line for line in stores), stores
    assert check_model_blocks(model)


# Rounding functions are one instruction from SSE4.1 on; only the x86-64 baseline sub-target (SSE2)
# calls the C library for them.
_ROUNDING_CALLS = {"floorf", "ceilf", "truncf", "roundf", "rintf", "nearbyintf"}


@pytest.mark.parametrize("op, options", [("TANH", {}), ("LOGISTIC", {}), ("EXP", {}), ("LOG", {}), ("RSQRT", {}),
                                         ("HARD_SWISH", {}), ("GELU", {"approximate": True}),
                                         ("GELU", {"approximate": False}), ("FULLY_CONNECTED", {})])
def test_transcendentals_are_vector_code_not_c_library_calls(op, options, tmp_path):
    # A math-library call (tanhf) runs a lane at a time: the tanh-form GELU epilogue of an FC
    # cost 7x the FC itself. (SIN and COS still call sinf / cosf: they run on positions, not in
    # epilogues.) Per x86 sub-target, the calls the kernel makes besides Halide's runtime.
    from halide_gen.aot import compile_kernel

    b = tflite_tools.ModelBuilder()
    x = b.input("x", [4, 64])
    if op == "FULLY_CONNECTED":  # with the tanh-form GELU epilogue
        fc = b.op(op, [x, b.const("w", np.ones((32, 64), np.float32)), None], [4, 32])
        b.output(b.op("GELU", [fc], [4, 32], approximate=True))
    else:
        b.output(b.op(op, [x], [4, 64], **options))
    sg = b.build().main
    art = compile_kernel(sg.operators, sg.outputs, "host", cache_dir=tmp_path, emit_asm=True)
    listings = sorted(p for p in art.extra if p.suffix == ".s")
    assert len(listings) > 1
    for k, listing in enumerate(listings):
        calls = {c.split("@")[0] for c in re.findall(r"\bcall[lq]?\s+\*?([A-Za-z_][\w@.]*)", listing.read_text())}
        calls = {c for c in calls if not c.startswith("halide_")}
        allowed = _ROUNDING_CALLS if k == len(listings) - 1 else set()  # the last: the x86-64 baseline
        assert calls <= allowed, (listing.name, calls)


@pytest.mark.parametrize("depth, channels, rows_outside", [(64, 128, True), (512, 256, False)])
def test_a_matrix_product_whose_weights_fit_l1_reads_each_input_row_once(depth, channels, rows_outside):
    # With the channel tiles outside the row tiles, every channel tile passes over all the rows: what
    # keeps a large weight matrix's slice in cache, but for weights that stay in L1 anyway (SegFormer's
    # 32 -> 128 projections over 16384 tokens: 16 KB) it read each input row once per channel tile
    # and wrote the output in strips (1.15x XNNPACK's time). Such products run the channel tiles
    # inside each task of row tiles (CpuParams.small_weight_bytes).
    from blockcheck import check_model_blocks
    from halide_gen.schedule.cpu import schedule_cpu

    rng = np.random.default_rng(0)
    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 1024, depth])
    w = b.const("w", rng.standard_normal((channels, depth)).astype(np.float32))
    b.output(b.op("FULLY_CONNECTED", [x, w, b.const("bias", np.zeros(channels, np.float32))], [1, 1024, channels],
                  keep_num_dims=True))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("projection", ops, [ops[0].outputs[0]])
    schedule_cpu(kernel)
    tasks = re.findall(r"halide_do_par_for\(\(halide_task_t\)::(\w+), 0, (\d+),", lowered_stmt(kernel))
    assert len(tasks) == 1, tasks
    assert ("_s0_x_x_o" in tasks[0][0]) == rows_outside, tasks
    assert check_model_blocks(model)


@pytest.mark.parametrize("shape, bands", [((1, 64, 64, 64), 8), ((1, 56, 80, 64), 8), ((1, 7, 7, 1280), 0)])
def test_a_sum_over_a_large_map_shares_bands_of_rows_among_threads(shape, bands):
    # Global average pooling summed the whole map on one thread: SegFormer's MEAN over [128, 128, 256]
    # took 1.3x XNNPACK's time at two threads. A large map's sum now runs over bands of rows in
    # parallel (a partial sum per band), then adds up the bands; a small one (EfficientNet's 7x7
    # pools, where the bands cost more than they share) stays one loop.
    from blockcheck import check_model_blocks
    from halide_gen.schedule.cpu import schedule_cpu

    b = tflite_tools.ModelBuilder()
    x = b.input("x", list(shape))
    b.output(b.op("MEAN", [x, b.const("axes", np.int32([1, 2]))], [1, 1, 1, shape[-1]], keep_dims=True))
    model = b.build()
    ops = model.main.operators
    kernel = build_block("pool", ops, [ops[0].outputs[0]])
    schedule_cpu(kernel)
    tasks = [int(n) for n in re.findall(r"halide_do_par_for\(\(halide_task_t\)::\w+, 0, (\d+),", lowered_stmt(kernel))]
    assert tasks == ([bands] if bands else []), tasks  # 64 rows: 8 bands of 8; 56: 8 of 7
    assert check_model_blocks(model)


def test_a_kernels_statement_reads_the_same_however_often_its_names_were_made_before():
    # Halide suffixes a Func's name with "$n" when one of that name was made before in the process,
    # so a test that matched a name in a statement passed alone and failed after other tests.
    from halide_gen.schedule.params import NEON

    b = tflite_tools.ModelBuilder()
    x = b.input("x", [1, 8, 16])
    w = b.const("w", np.ones((16, 16), np.float32))
    b.output(b.op("FULLY_CONNECTED", [b.op("LOGISTIC", [x], [1, 8, 16]), w, None], [1, 8, 16], keep_num_dims=True))
    model = b.build()
    funcs = [re.findall(r"allocate (\S+)\[", scheduled_stmt(model, NEON)) for _ in range(2)]
    assert funcs[0] and funcs[1] == funcs[0] and not any("$" in f for f in funcs[1]), funcs


def test_every_statement_a_test_reads_has_stable_names():
    # Tests read statements only through halide_text, which makes the names stable.
    from pathlib import Path

    here = Path(__file__).parent
    readers = [p.name for p in here.glob("*.py") if p.name != "halide_text.py"
               and re.search(r"compile_to_lowered_stmt\(|read_text\(\)[^\n]*\.stmt\b", p.read_text())]
    assert readers == [], "read a statement through halide_text"


def _innermost_loops(listing: str) -> list[list[str]]:
    """The innermost loops of an x86 assembly listing: the lines from a label to a later jump back
    to it, with no such loop inside."""
    lines, where, spans = listing.splitlines(), {}, []
    for k, line in enumerate(lines):
        if (label := re.match(r"^(\.LBB\w+):", line)) is not None:
            where[label.group(1)] = k
        jump = re.match(r"^\s+j\w+\s+(\.LBB\w+)", line)
        if jump is not None and jump.group(1) in where:
            spans.append((where[jump.group(1)], k))
    return [lines[a:b + 1] for a, b in spans if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)]


MULTIPLY_ADDS = re.compile(r"\b(vfn?madd\w*|vpdpbusd|v?pmaddwd|v?pmaddubsw|mulps)\b")
VECTOR_TO_STACK = re.compile(r"\bv?mov\w*\s+%[xyz]mm\d+,.*\(%rsp\)")


def _product_model(case: str):
    rng = np.random.default_rng(0)
    if case.startswith("int8"):
        from test_lowering_int8 import conv_model, fully_connected_model

        return fully_connected_model(64, 128, 128) if case == "int8 fc" else conv_model((1, 28, 28, 32), 64, 1, 1, "SAME")
    w = lambda *shape: (rng.standard_normal(shape) * 0.1).astype(np.float32)  # noqa: E731
    b = tflite_tools.ModelBuilder()
    if case == "fc":
        x = b.input("x", [1, 64, 96])
        b.output(b.op("FULLY_CONNECTED", [x, b.const("w", w(128, 96)), b.const("b", w(128))], [1, 64, 128],
                      keep_num_dims=True))
    else:  # a 1x1 or 3x3 conv into 28-pixel rows, which a 7-pixel tile divides (unpadded: tiles by the
        k = 3 if case == "conv 3x3" else 1  # padding guard each load, which costs registers of its own)
        x = b.input("x", [1, 27 + k, 27 + k, 32])
        b.output(b.op("CONV_2D", [x, b.const("w", w(64, k, k, 32)), b.const("b", w(64))], [1, 28, 28, 64],
                      padding="VALID", stride_h=1, stride_w=1, fused_activation_function="RELU6"))
    return b.build()


@pytest.mark.parametrize("case", ["fc", "conv 1x1", "conv 3x3", "int8 fc", "int8 conv"])
def test_no_x86_build_keeps_a_register_tiles_accumulators_on_the_stack(case, tmp_path):
    # The host library holds builds for AVX-512 (32 vector registers), AVX2 and SSE (16 each). All
    # scheduled with AVX-512's 32 x 12 tile, the AVX2 build kept every accumulator on the stack, a
    # store and a load around each FMA (2.2x XNNPACK's time on an AVX2 host); a 16 x 7 conv tile
    # (whole_rows' extra pixel) spilled too. No build's multiply-add loop stores a vector to the
    # stack in its innermost loop, the reduction's; int8 sums on SSE2, the baseline, widen through
    # more temporaries than it has registers.
    from halide_gen.aot import compile_kernel

    sg = _product_model(case).main
    art = compile_kernel(sg.operators, sg.outputs, "host", cache_dir=tmp_path, emit_asm=True)
    listings = sorted(p for p in art.extra if p.suffix == ".s")
    for listing in listings[:-1] if case.startswith("int8") else listings:
        products = [loop for loop in _innermost_loops(listing.read_text()) if any(MULTIPLY_ADDS.search(ln) for ln in loop)]
        assert products, listing.name
        spills = [ln.strip() for loop in products for ln in loop if VECTOR_TO_STACK.search(ln)]
        assert not spills, (listing.name, spills[:4])


def test_each_x86_build_is_scheduled_for_its_vector_registers():
    # AVX-512's three builds share its tiles; AVX2 and the SSE2 baseline have tiles of their own.
    import halide as hl

    from halide_gen.schedule import X86, X86_AVX2, X86_SSE, schedule_variant, template_params
    from halide_gen.targets import target_spec

    spec = target_spec("host")
    params = [template_params(spec, "template", t) for t in spec.targets()]
    assert params == [X86, X86, X86, X86_AVX2, X86_SSE]
    assert len({schedule_variant(spec, "template", t) for t in spec.targets()}) == 3
    assert template_params(spec, "template-7px", spec.targets()[3]).conv_row_pixels == 0  # variants apply to each
    # An autoscheduler plans each build for itself.
    assert len({schedule_variant(spec, "Adams2019", t) for t in spec.targets()}) == len(spec.targets())
    for p in (X86, X86_AVX2, X86_SSE):  # accumulators, weight vectors and a broadcast input fit 32 / 16 / 16
        registers = 32 if p is X86 else 16
        assert (p.mm_channels // p.lanes) * (p.mm_rows + 1) + 1 <= registers
        assert (p.conv_channels // p.lanes) * (p.conv_pixels + 1) + 1 <= registers
    native = target_spec("host-native")
    host = hl.get_host_target()
    expected = X86 if host.has_feature(hl.TargetFeature.AVX512) else X86_AVX2 if host.has_feature(
        hl.TargetFeature.AVX2) else X86_SSE
    assert template_params(native, "template", native.targets()[0]) == expected
