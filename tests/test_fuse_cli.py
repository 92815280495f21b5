"""`tflite_tools fuse --plan-only`: text, JSON, Graphviz, --explain, and every model; the same flags
with `-o OUT`."""

from __future__ import annotations

import json

import pytest

from tflite_tools import cli
from conftest import model_id, project_model_paths, shared_model_paths


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", str(tmp_path / "cache"))


def fuse_json(capsys, *args):
    assert cli.main(["fuse", "--plan-only", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_promised_keys(capsys, model_path):
    data = fuse_json(capsys, str(model_path("transformer_encoder")))
    for key in ("ops", "ops_after_rewrite", "blocks", "fusion_rate", "intermediate_bytes_before",
                "intermediate_bytes_after", "peak_bytes_before", "peak_bytes_after"):
        assert key in data
    assert data["ops"] == 56
    covered = sorted(i for b in data["blocks"] for i in b["ops"])
    assert covered == list(range(data["ops_after_rewrite"]))  # every op in exactly one block
    assert data["fusion_rate"] == round(data["ops"] / len(data["blocks"]), 3)
    assert data["fusion_rate"] >= 3  # transformer models fuse at least 3x
    assert data["intermediate_bytes_after"] < data["intermediate_bytes_before"]
    assert {b["fused_type"] for b in data["blocks"]} <= {"OtO", "OtM", "MtM", "Reorg", "Shuffle"}


def test_fast_math_rewrites_more(capsys, model_path):
    exact = fuse_json(capsys, str(model_path("transformer_encoder")))
    fast = fuse_json(capsys, "--fast-math", str(model_path("transformer_encoder")))
    assert fast["ops_after_rewrite"] < exact["ops_after_rewrite"]
    assert fast["rewrites"]["factor_common_operand"] == 3


def test_text_report_and_explain(capsys, model_path):
    assert cli.main(["fuse", "--plan-only", "--explain", str(model_path("conv_fp16_weights"))]) == 0
    out = capsys.readouterr().out
    assert "ops: 5 before rewriting, 2 after" in out
    assert "constant_folding" in out and "fusion rate" in out and "peak live activations" in out


def test_dot_output(capsys, model_path, tmp_path):
    dot = tmp_path / "plan.dot"
    assert cli.main(["fuse", "--plan-only", "--dot", str(dot), str(model_path("swish_chain"))]) == 0
    text = dot.read_text()
    assert text.startswith("digraph plan {") and "cluster_0" in text and "n0 -> n1;" in text


def test_plan_flags_work_with_out_too(capsys, model_path, tmp_path):
    # --dot, --json, --explain and --verbose with -o: each does what it does with --plan-only.
    dot, out = tmp_path / "plan.dot", tmp_path / "out"
    args = ["fuse", str(model_path("conv_fp16_weights")), "-o", str(out), "--dot", str(dot), "--verbose"]
    assert cli.main([*args, "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    # The fused model's graph: the rewritten one with the stored weights' decoders put back.
    assert data["ops"] == 5 and data["ops_after_rewrite"] == 2 + data["decoders"] and data["kernels"] >= 1
    assert str(out / "model.fused.tflite") in data["written"]
    assert dot.read_text().startswith("digraph plan {")
    assert "[rewrite]" in captured.err
    assert cli.main([*args, "--explain"]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "constant_folding" in text and "fusion rate" in text


def test_fuse_without_out_or_plan_only_is_a_clear_error(capsys, model_path):
    assert cli.main(["fuse", str(model_path("add_relu"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plan-only" in err and "-o OUT" in err


def test_fuse_bad_model_is_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"TFL3" * 3)
    assert cli.main(["fuse", "--plan-only", str(bad)]) == 2
    assert "corrupt or truncated" in capsys.readouterr().err


def test_fp16_on_a_cpu_target_is_exit_2(capsys, model_path, tmp_path):
    assert cli.main(["fuse", str(model_path("add_relu")), "-o", str(tmp_path / "out"), "--gpu-precision", "fp16"]) == 2
    assert "--gpu-precision fp16 needs a GPU target" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_every_gpu_target_has_an_fp16_variant_and_no_cpu_target_does():
    from halide_gen.targets import GPU_TARGETS, TARGETS, with_precision

    assert {with_precision(t, "fp16") for t in GPU_TARGETS} == {n for n, s in TARGETS.items()
                                                                if s.precision == "fp16" and s.family == "gpu"}
    assert with_precision("host", "fp32") == "host"
    with pytest.raises(ValueError, match="needs a GPU target"):
        with_precision("arm64-linux", "fp16")


def test_armv8_2_targets_compute_in_fp16_on_request_and_the_others_refuse_it():
    from halide_gen.targets import target_spec, with_cpu_precision

    for name in ("arm64-linux", "arm64-android"):
        spec = target_spec(with_cpu_precision(name, "fp16"))
        assert spec.half_arithmetic and spec.lowering_options().half_arithmetic and spec.dot_product
        assert all(t.endswith("-arm_fp16") for t in spec.halide) and spec.library_suffix == "_fp16"
    assert not target_spec("arm64-linux").half_arithmetic and not target_spec("host-opencl-fp16").half_arithmetic
    for name, why in [("host", "x86 has no fp16 arithmetic"), ("arm64-linux-nodot", "ARMv8.0 cores have no fp16"),
                      ("host-vulkan", "GPU targets take --gpu-precision")]:
        with pytest.raises(ValueError, match=why):
            with_cpu_precision(name, "fp16")


def test_fp16_arithmetic_on_a_target_without_it_is_exit_2(capsys, model_path, tmp_path):
    assert cli.main(["fuse", str(model_path("add_relu")), "-o", str(tmp_path / "out"), "--target", "host",
                     "--cpu-precision", "fp16"]) == 2
    assert "--cpu-precision fp16 needs an ARMv8.2 target (arm64-linux, arm64-android), not host:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_int8_rounding_defaults_to_xnnpacks_on_x86_and_the_references_on_arm():
    from halide_gen.targets import BASE_TARGETS, TARGETS, target_spec, with_int8_rounding

    assert target_spec("host").int8_rounding == "xnnpack"
    assert all(target_spec(t).int8_rounding == "reference" for t in BASE_TARGETS if not t.startswith("host"))
    assert with_int8_rounding("host", None) == with_int8_rounding("host", "xnnpack") == "host"
    assert with_int8_rounding("host", "reference") == "host-int8-reference"
    assert TARGETS[with_int8_rounding("arm64-linux", "xnnpack")].int8_rounding == "xnnpack"
    with pytest.raises(ValueError, match="needs a CPU target"):
        with_int8_rounding("host-opencl", "xnnpack")


def test_int8_rounding_on_a_gpu_target_is_exit_2(capsys, model_path, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["fuse", str(model_path("add_relu")), "-o", str(out), "--target", "host-vulkan",
                     "--int8-rounding", "xnnpack"]) == 2
    assert "--int8-rounding xnnpack needs a CPU target" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("path", project_model_paths() + shared_model_paths(), ids=model_id)
def test_plan_only_runs_on_every_model(capsys, path):
    data = fuse_json(capsys, str(path))
    assert sum(len(b["ops"]) for b in data["blocks"]) == data["ops_after_rewrite"]


@pytest.mark.parametrize("named", ["host-native", "host"])
def test_the_default_target_is_the_environments(named, capsys, model_path, tmp_path, monkeypatch):
    # DNNFUSION_TARGET names the target fuse builds when --target does not (the tests' own: host-native).
    monkeypatch.setenv("DNNFUSION_TARGET", named)
    assert cli.main(["fuse", str(model_path("add_relu")), "-o", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["target"] == named
    assert cli.main(["fuse", str(model_path("add_relu")), "-o", str(tmp_path / "arm"), "--target", "arm64-linux",
                     "--plan-only"]) == 0


def test_a_default_target_naming_no_target_is_exit_2(capsys, model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("DNNFUSION_TARGET", "host-avx9")
    assert cli.main(["fuse", str(model_path("add_relu")), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tflite_tools: error: DNNFUSION_TARGET=host-avx9 names no target; known: host,")
    assert not (tmp_path / "out").exists()


def test_a_native_target_is_the_first_build_of_host_this_cpu_runs():
    import halide as hl

    from halide_gen.targets import target_spec

    native, host = target_spec("host-native"), target_spec("host")
    (build,) = native.halide
    assert build in host.halide and native.family == host.family and native.int8_rounding == host.int8_rounding
    here = hl.get_host_target()
    features = [f for f in hl.TargetFeature.__members__.values() if int(f) < int(hl.TargetFeature.FeatureEnd)]

    def runs_here(b: str) -> bool:
        return all(here.has_feature(f) for f in features if hl.Target(b).has_feature(f))

    assert runs_here(build) and not any(runs_here(b) for b in host.halide[:host.halide.index(build)])
    required = set(native.required_cpu_features())
    assert required == {int(f) for f in features if hl.Target(build).has_feature(f)} and required
    assert host.required_cpu_features() == []  # Halide's multitarget dispatch checks those
