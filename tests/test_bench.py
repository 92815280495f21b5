"""tflite_tools bench: the maths and the report (never a timing assertion)."""

from __future__ import annotations

import json

import pytest

from conftest import answers_ctrl_c

from tflite_tools import cli
from tflite_tools.bench import Timings, format_benchmark, host_cpu, ratios


def timings(name: str, runs: list[float]) -> Timings:
    return Timings(name, init_us=1000.0, first_us=500.0, warmup_us=[400.0, 200.0], runs_us=runs)


def test_ratio_is_median_over_xnnpack_median():
    t = [timings("xnnpack", [10, 12, 11, 100]), timings("dnnfusion-all", [5, 6, 5.5, 5.5])]
    rel = ratios(t)
    assert rel["xnnpack"] == 1.0 and rel["dnnfusion-all"] == pytest.approx(5.5 / 11.5)


def test_ratios_need_the_baseline():
    with pytest.raises(ValueError, match="xnnpack"):
        ratios([timings("builtin", [1.0])])


def test_spread_is_the_interquartile_range_over_the_median():
    t = timings("xnnpack", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert t.median == 5 and t.spread == pytest.approx((7.5 - 2.5) / 5)


def test_benchmark_model_lines_read_like_the_tool():
    stats, summary = timings("xnnpack", [10.0, 20.0, 12.5, 11.0]).benchmark_model_lines()
    assert stats == "count=4 first=10 curr=11 min=10 max=20 avg=13.375 std=4 p5=10 median=11 p95=18"
    assert summary == ("Inference timings in us: Init: 1000, First inference: 500, Warmup (avg): 300, "
                       "Inference (avg): 13.375")


def test_report_has_every_contender_and_its_ratio():
    t = [timings("xnnpack", [2000.0] * 5), timings("builtin", [4000.0] * 5)]
    t[1].peak_memory_kib = 2048
    text = format_benchmark(t, "m.tflite", 1)
    assert "builtin" in text and "2.00x" in text and "2.0" in text.splitlines()[4]
    assert text.count("Inference timings in us:") == 2 and text.count("] count=5 first=") == 2


def test_cli_bench_runs_every_contender(capsys, model_path):
    assert cli.main(["bench", str(model_path("add_relu")), "--runs", "3", "--warmup", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in data["contenders"]] == ["xnnpack", "builtin"]
    first = data["contenders"][0]
    assert first["ratio_to_xnnpack"] == 1.0 and len(first["samples_us"]) == 3 and len(first["warmup_us"]) == 1
    assert first["min_us"] <= first["p5_us"] <= first["median_us"] <= first["p95_us"] <= first["max_us"]
    assert first["benchmark_model"][0].startswith("count=3 first=")
    assert data["host"]["cores"] >= 1 and data["versions"]["halide"]


def test_cli_bench_takes_benchmark_models_flags_and_delegate_options(capsys, model_path, tmp_path, private_cache):
    # benchmark_model's flag names, and its 'key:value;key:value' delegate options: one contender
    # with exactly those; --require-claims fails when the delegate claims nothing.
    from tflite_tools.fuse import fuse

    result = fuse(model_path("add_relu"), tmp_path / "out", cache_dir=private_cache)
    args = ["bench", str(result.model), "--external_delegate_path", str(result.library), "--num_runs", "4",
            "--warmup_runs", "1", "--num_threads", "1", "--require-claims"]
    assert cli.main([*args, "--delegate-options", "claim:all;log_level:error", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in data["contenders"]] == ["xnnpack", "builtin", "dnnfusion"]
    assert all(len(c["samples_us"]) == 4 for c in data["contenders"])
    assert cli.main([*args, "--delegate-options", "claim:none"]) == 2
    assert "the delegate claimed nothing" in capsys.readouterr().err
    assert cli.main(["bench", str(result.model), "--require-claims"]) == 2
    assert "need --delegate" in capsys.readouterr().err


def test_cli_bench_resizes_the_inputs_as_benchmark_model_does(capsys, model_path, tmp_path, private_cache):
    # --input_layer_shape: a batch of 3 of a model fused at batch 1 stays claimed (each block on
    # windows of one item); a shape LiteRT cannot take, or one shape too many, is one line and exit 2.
    from tflite_tools.fuse import fuse

    result = fuse(model_path("add_relu"), tmp_path / "out", cache_dir=private_cache)
    args = ["bench", str(result.model), "--delegate", str(result.library), "--runs", "2", "--warmup", "0"]
    assert cli.main([*args, "--input_layer_shape", "3,4,4,3:3,4,4,3", "--require-claims", "--json"]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)["contenders"]][0] == "xnnpack"
    for shape, why in (("1,4,4,3:1,4,4,5", "LiteRT cannot run the model at --input_layer_shape"),
                       ("1,4,4,3:1,4,4,3:1,2", "names 3 shapes; the model has 2 inputs"),
                       ("1,x", "expected dims like")):
        assert cli.main([*args, "--input_layer_shape", shape]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err


def test_cli_bench_at_two_threads_runs_each_contender_in_its_own_process(capsys, model_path):
    # More than one thread: contenders take turns from processes of their own (their thread pools
    # would share the cores otherwise); the figures come back as at one thread.
    assert cli.main(["bench", str(model_path("add_relu")), "--threads", "2", "--runs", "12", "--warmup", "2",
                     "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in data["contenders"]] == ["xnnpack", "builtin"]
    assert all(0 < c["min_us"] <= c["median_us"] <= c["max_us"] for c in data["contenders"])


def test_cli_bench_refuses_zero_runs(capsys, model_path):
    assert cli.main(["bench", str(model_path("add_relu")), "--runs", "0"]) == 2
    assert "--runs" in capsys.readouterr().err


def test_isolated_contender_that_cannot_run_the_model_is_a_model_error(tmp_path):
    # A contender timed in a process of its own reports its failure to the parent as one clear error.
    from tflite_tools.bench import Contender, time_contenders
    from tflite_tools.model.errors import ModelError

    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"not a flatbuffer" * 8)
    with pytest.raises(ModelError, match="xnnpack cannot run the model"):
        time_contenders([Contender("xnnpack", str(garbage))], threads=2, runs=1, warmup=0)


def test_an_interrupt_before_a_contender_answers_ends_its_process_quietly(capfd, model_path, monkeypatch):
    # Ctrl-C while a contender's process still builds its interpreter: the call unwinds only once
    # that process has ended, and the process prints nothing (no "Process SpawnProcess-n:").
    import multiprocessing

    from tflite_tools import bench

    def interrupted(process, conn, name):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "_answer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench.time_contenders([bench.Contender("xnnpack", str(model_path("add_relu")))], threads=2, runs=1, warmup=0)
    assert multiprocessing.active_children() == []
    err = capfd.readouterr().err
    assert "Process" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("cold", [False, True])
def test_turns_time_batches_after_an_untimed_invoke_or_single_cold_invokes(cold):
    # Warm: each turn a contender runs one untimed invoke (its caches settle after the other
    # contender's) and then up to BATCH timed ones; cold: one timed invoke per turn. Either way the
    # order changes each turn, and every contender gets its warm-ups and runs exactly.
    from tflite_tools.bench import BATCH, _take_turns

    calls: list[tuple[int, int]] = []

    def batch(k: int, count: int) -> list[float]:
        calls.append((k, count))
        return [float(k * 100000 + len(calls) * 100 + i) for i in range(count)]

    t = [Timings("a", 0.0, 0.0), Timings("b", 0.0, 0.0)]
    _take_turns(t, batch, runs=25, warmup=3, cold=cold, progress=None)
    assert all(len(x.warmup_us) == 3 and len(x.runs_us) == 25 for x in t)
    settle = 0 if cold else 1
    assert calls[:2] == [(0, 3 + settle), (1, 3 + settle)]  # the warm-ups first
    assert calls[2][0] == 1 and calls[3][0] == 0  # the next turn starts with the other contender
    per_turn = 1 if cold else BATCH
    assert all(count - settle <= per_turn for _, count in calls[2:])
    timed = sum(count - settle for _, count in calls)
    assert timed == 2 * (25 + 3)
    if not cold:  # the untimed invoke's time (the first of each batch, ending in 00) is dropped
        assert all(int(us) % 100 != 0 for x in t for us in x.warmup_us + x.runs_us)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_each_contender_follows_every_other_equally_often(n):
    # In a fixed rotation one contender always ran right after LiteRT's builtin kernels, which at two
    # threads slowed whoever came next by a third: the orders balance who follows whom.
    from collections import Counter

    from tflite_tools.bench import balanced_orders

    orders = balanced_orders(n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    follows = Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) <= 1


def test_report_says_how_the_runs_were_taken():
    t = [timings("xnnpack", [2000.0] * 5)]
    assert "in turns of 10" in format_benchmark(t, "m.tflite", 1)
    assert "each after another contender" in format_benchmark(t, "m.tflite", 1, cold=True)


def test_block_table_times_each_block_through_the_delegate(capsys, model_path):
    """bench/block_table.py --delegate: every block cut out, fused and run by LiteRT with the delegate
    claiming it beside XNNPACK; one row per block with both times and their ratio."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import block_table

    assert block_table.main(["--delegate", "--runs", "5", str(model_path("fc_softmax"))]) == 0
    out = capsys.readouterr().out
    assert "| block | ops | delegate ms | XNNPACK ms | ratio | delegate GFLOP/s |" in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| block_")]
    assert [row[2].strip() for row in rows] == ["FULLY_CONNECTED", "SOFTMAX"]
    assert all(float(row[5]) > 0 for row in rows)
    # Several thread counts: the columns repeat per count; --unique adds how many blocks each row
    # stands for, and the total weighs each row by it.
    model = str(model_path("transformer_encoder"))
    assert block_table.main([model, "--delegate", "--unique", "--threads", "1", "2", "--seconds", "0.01",
                             "--runs", "20"]) == 0
    out = capsys.readouterr().out
    assert ("| block | ops | count | delegate ms | XNNPACK ms | ratio (1 thread) | delegate GFLOP/s | "
            "delegate ms | XNNPACK ms | ratio (2 threads) |") in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| block_")]
    assert rows and all(float(row[6]) > 0 and float(row[10]) > 0 for row in rows)
    assert sum(int(row[3]) for row in rows) > len(rows)  # the encoder's layers repeat their blocks


def test_random_ids_stay_under_the_smallest_table_they_index(capsys, model_path, tmp_path):
    # A BERT's segment ids index a table of 2 rows: ids drawn from [0, 16) failed every contender's
    # invoke. run and bench draw the same inputs (runtime.model_inputs), under the table's size.
    import numpy as np

    from tflite_tools import runtime

    model = model_path("segment_embeddings")
    interp = runtime.make_interpreter(model, "reference")
    ids, segments = runtime.random_inputs(interp, seed=1)
    assert ids.max() < 16 and ids.max() >= 2 and segments.max() == 1 and segments.min() == 0
    assert cli.main(["bench", str(model), "--runs", "2", "--warmup", "0"]) == 0
    capsys.readouterr()
    np.save(tmp_path / "ids.npy", np.full((1, 8), 29, np.int32))
    np.save(tmp_path / "segments.npy", np.zeros((1, 8), np.int32))
    assert cli.main(["bench", str(model), "--runs", "2", "--warmup", "0", "--json",
                     "--inputs", str(tmp_path / "ids.npy"), str(tmp_path / "segments.npy")]) == 0
    assert json.loads(capsys.readouterr().out)["contenders"]


def test_bench_inputs_are_checked_as_runs_are(capsys, model_path, tmp_path):
    import numpy as np

    np.save(tmp_path / "wrong.npy", np.zeros((2, 8), np.int32))
    code = cli.main(["bench", str(model_path("segment_embeddings")), "--runs", "2",
                     "--inputs", str(tmp_path / "wrong.npy"), str(tmp_path / "wrong.npy")])
    err = capsys.readouterr().err
    assert code == 2 and "shape [2, 8], input 'ids' takes [1, 8]" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("threads", ["0", "100000"])
def test_thread_counts_past_the_delegates_cap_are_refused(capsys, model_path, command, threads):
    # 100,000 interpreter threads exhausted the machine's thread limit: refused, as the delegate's
    # own num_threads is past 256, in one line before anything starts.
    code = cli.main([command, str(model_path("add_relu")), "--threads", threads])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"tflite_tools: error: {command}: --threads must be from 1 to 256, got {threads}"


def test_ctrl_c_during_a_threaded_bench_ends_it_without_a_traceback(model_path):
    # Ctrl-C reaches the whole process group: only the parent answers it (exit 130, one line), and
    # the contenders' processes, started deaf to it, end with it instead of printing tracebacks.
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "tflite_tools", "bench", str(model_path("add_relu")), "--threads", "2",
                             "--runs", "1000000"], stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=answers_ctrl_c)
    try:
        deadline = time.monotonic() + 120
        # Interrupt once the contenders' processes are timing (progress lines: "[n/total] turn k").
        while time.monotonic() < deadline and "turn" not in (line := proc.stderr.readline()):
            assert line or proc.poll() is None, "bench ended before it was interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == "tflite_tools: interrupted"


def test_delegate_options_read_both_forms():
    from tflite_tools.cli import delegate_options
    from tflite_tools.model.errors import ModelError

    assert delegate_options(["claim=all", "num_threads:2;log_level:error"], "--option") == {
        "claim": "all", "num_threads": "2", "log_level": "error"}
    with pytest.raises(ModelError, match="expected KEY=VALUE or key:value;key:value"):
        delegate_options(["claim"], "--option")


def test_the_host_names_the_vector_extension_x86_kernels_turn_on():
    # A VM may hide AVX-512 from a CPU whose model name has it: the figures must say what ran.
    def cpuinfo(name, flags):
        return "".join(f"processor\t: {k}\nmodel name\t: {name}\nflags\t\t: {flags}\n\n" for k in range(2))

    assert host_cpu(cpuinfo("AMD EPYC", "fpu sse2 avx fma avx2 bmi2")) == "AMD EPYC (AVX2, no AVX-512)"
    assert host_cpu(cpuinfo("Intel Xeon", "avx2 avx512f avx512_vnni amx_tile")) == "Intel Xeon (AVX-512)"
    assert host_cpu("processor\t: 0\nmodel name\t: Cortex\nFeatures\t: fp asimd\n") == "Cortex"
