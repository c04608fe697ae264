"""The kernels task (tasks/kernels.py) on the CPU, tiny preset: ordinary ok records, one point
per backend, phase and shape with the backend that ran, FLOP counts from the op's spec, the
Triton backend under the interpreter, FLA's column through a stand-in package."""

import json
import math
import sys

import pytest
import torch

import tasks.kernels as kernels_module
from harness.config import ConfigError, resolve_config
from harness.runner import RunSpec, execute
from harness.tracking import Tracker
from kernels.common.dispatch import backend_status
from kernels.registry import SPECS
from tasks.base import RunContext
from tasks.kernels import Kernels
from tests.tasks.test_throughput_fla import _stand_in_fla

POINT_FIELDS = {"op", "variant", "backend", "phase", "B", "T", "H", "K", "V", "status", "ms", "p20_ms", "p80_ms",
                "repeats", "tokens_per_s", "flops", "tflops", "bytes", "gb_per_s"}


def _config(*sets):
    return resolve_config(Kernels, "tiny", None, list(sets))


def _run(tmp_path, mixer, *sets):
    ctx = RunContext(mixer=mixer, config=_config(*sets), device=torch.device("cpu"), seed=0, artifact_dir=tmp_path)
    return Kernels().run(ctx)


@pytest.mark.parametrize("mixer,op", [("linear", "linear_attention"), ("gdn", "gated_delta_rule")])
def test_record_of_the_tiny_preset(tmp_path, mixer, op):
    cfg = _config("backends=[torch]")
    record, path = execute(RunSpec(mixer, Kernels, "tiny", cfg, torch.device("cpu"), 0), tmp_path, Tracker(enabled=False))
    assert record.status == "ok", record.error
    data = json.loads(path.read_text())
    assert data["task"] == "kernels" and data["backend"] == "torch"
    details, metrics = data["details"], data["metrics"]
    assert details["op"] == op and details["op_options"] == {"chunk_size": 64}
    points = details["points"]
    assert len(points) == 2 * 2  # 2 lengths x 2 phases, one backend
    for p in points:
        assert POINT_FIELDS <= set(p) and p["status"] == "ok" and p["backend"] == "torch"
        assert p["B"] * p["T"] == 64 and (p["H"], p["K"], p["V"]) == (2, 16, 16)
        assert p["flops"] == SPECS[op].counts.flops(p["phase"], p["B"], p["T"], 2, 16, 16, chunk_size=64)
        assert p["tflops"] == pytest.approx(p["flops"] / (p["ms"] / 1e3) / 1e12)
    for key in ("fwd_ms", "fwdbwd_ms", "fwd_tflops", "fwdbwd_tflops", "torch_fwdbwd_ms@T32_H2_K16"):
        assert math.isfinite(metrics[key]) and metrics[key] > 0, key
    assert metrics["points_failed"] == 0
    assert details["backends"]["torch"] == "ok" and "fla" in details["backends"]


@pytest.mark.skipif(not backend_status("triton", "cpu").usable, reason="no Triton interpreter here")
def test_triton_runs_under_the_interpreter_beside_torch(tmp_path):
    result = _run(tmp_path, "linear", "seq_lens=[16]")
    ran = {(p["backend"], p["phase"]): p["status"] for p in result.details["points"]}
    assert ran == {(b, ph): "ok" for b in ("torch", "triton") for ph in ("fwd", "fwdbwd")}
    assert result.backend == "torch", "the record's backend is the one 'auto' picks here"
    assert "triton_fwdbwd_ms@T16_H2_K16" in result.metrics


def test_profile_records_each_points_top_operators(tmp_path):
    result = _run(tmp_path, "gdn", "backends=[torch]", "seq_lens=[32]", "profile=4")
    for p in result.details["points"]:
        rows = p["kernels"]
        assert 1 <= len(rows) <= 4 and all(r["us_per_call"] > 0 and r["launches_per_call"] > 0 for r in rows)
        assert [r["us_per_call"] for r in rows] == sorted((r["us_per_call"] for r in rows), reverse=True)
    assert "kernels" not in _run(tmp_path, "gdn", "backends=[torch]", "seq_lens=[32]").details["points"][0]


def test_kernel_breakdown_refuses_empty_counts():
    from tasks.common.kernel_profile import kernel_breakdown

    with pytest.raises(ValueError, match="calls >= 1"):
        kernel_breakdown(lambda: None, torch.device("cpu"), calls=0)


def test_the_mixer_options_choose_the_variant_and_the_op_options(tmp_path):
    result = _run(tmp_path, "gla", "backends=[torch]", "phases=[fwd]", "mixer.gate=scalar", "mixer.chunk_size=16")
    assert result.details["variant"] == "scalar" and result.details["op_options"] == {"chunk_size": 16}
    mesa = _run(tmp_path, "mesa", "backends=[torch]", "phases=[fwd]", "seq_lens=[16]", "mixer.cg_steps=3")
    assert mesa.details["op_options"] == {"chunk_size": 64, "cg_steps": 3, "cg_tol": None}
    assert mesa.details["points"][0]["flops"] == SPECS["mesa"].counts.forward(4, 16, 2, 16, 16, cg_steps=3)


def test_fla_column_beside_the_backends(tmp_path, monkeypatch):
    calls: list[str] = []
    fla = _stand_in_fla(calls)
    monkeypatch.setitem(sys.modules, "fla", fla)
    monkeypatch.setitem(sys.modules, "fla.ops", fla.ops)
    monkeypatch.setattr(kernels_module, "fla_status", lambda device: None)
    result = _run(tmp_path, "gdn", "backends=[torch]", "seq_lens=[16]")
    fla_points = [p for p in result.details["points"] if p["backend"] == "fla"]
    assert [p["phase"] for p in fla_points] == ["fwd", "fwdbwd"]
    assert all(p["status"] == "ok" and p["kernel"] == "chunk_gated_delta_rule" for p in fla_points)
    assert set(calls) == {"chunk_gated_delta_rule"}
    assert result.metrics["torch_fwd_speedup_vs_fla"] > 0
    skipped = _run(tmp_path, "lin_gdn", "backends=[torch]", "seq_lens=[16]", "phases=[fwd]")
    assert "no kernel" in skipped.details["backends"]["fla"]
    assert {p["backend"] for p in skipped.details["points"]} == {"torch"}


def test_bad_input_is_refused_before_a_run():
    with pytest.raises(ValueError, match="valid mixers: .*gdn"):
        Kernels.check_mixer("nope")
    with pytest.raises(ConfigError, match="unknown backends \\['cuda'\\]"):
        _config("backends=[cuda]")
    with pytest.raises(ConfigError, match="set by `heads`"):
        _config("mixer.num_heads=4")


def test_gpu_preset_has_the_anchor_shapes():
    cfg = resolve_config(Kernels, "gpu")
    assert cfg.token_budget == 65536 and cfg.seq_lens == [2048, 8192, 32768] and cfg.dtype == "bfloat16"
    assert [(h.num_heads, h.head_dim) for h in cfg.heads] == [(16, 128), (32, 64)]


def test_launch_changes_are_validated_against_the_settings_dataclasses():
    cfg = _config("launch.gated_delta_rule.wy_fwd.BK=32", "launch.gated_delta_rule.fused_fwd.enabled=true")
    assert cfg.launch == {"gated_delta_rule": {"wy_fwd": {"BK": 32}, "fused_fwd": {"enabled": True}}}
    with pytest.raises(ConfigError, match="no launch settings for op 'softmax_attention'"):
        _config("launch.softmax_attention.fwd.BK=32")
    with pytest.raises(ConfigError, match="gated_delta_rule.wy_fwd: no setting 'BQ'"):
        _config("launch.gated_delta_rule.wy_fwd.BQ=32")
    with pytest.raises(ConfigError, match="BK must be one of"):
        _config("launch.gated_delta_rule.wy_fwd.BK=48")


@pytest.mark.skipif(not backend_status("triton", "cpu").usable, reason="no Triton interpreter here")
def test_launch_changes_hold_for_the_run_and_land_in_its_record(tmp_path):
    cfg = _config("backends=[triton]", "seq_lens=[16]", "phases=[fwd]", "launch.linear_attention.fwd_output.BV=32")
    record, path = execute(RunSpec("linear", Kernels, "tiny", cfg, torch.device("cpu"), 0), tmp_path, Tracker(enabled=False))
    assert record.status == "ok", record.error
    launch = json.loads(path.read_text())["launch"]["linear_attention"]
    assert launch["fwd_output"]["BV"] == 32 and launch["fwd_output"]["BK"] == 64


def test_the_launch_sweep_varies_block_sizes():
    from pathlib import Path

    from harness.sweep import expand, load_sweep

    plan = expand(load_sweep(Path(__file__).parents[2] / "configs" / "kernels-launch.yaml"), "cuda")
    launches = [p.config["launch"]["gated_delta_rule"] for p in plan.points]
    assert len(plan.points) == len({p.key for p in plan.points}) == 6
    assert {(x["wy_fwd"]["BK"], x["output_fwd"]["BV"]) for x in launches} == {(a, b) for a in (32, 64, 128) for b in (64, 128)}


def test_the_mesa_launch_sweep_varies_the_solve_warps_rows_and_gradient_columns():
    from pathlib import Path

    from harness.sweep import expand, load_sweep

    plan = expand(load_sweep(Path(__file__).parents[2] / "configs" / "kernels-launch-mesa.yaml"), "cuda")
    launches = [p.config.get("launch", {}).get("mesa", {}) for p in plan.points]
    assert len(plan.points) == len({p.key for p in plan.points}) == 11
    settings = {(x.get("fwd_solve", {}).get("num_warps"), x.get("bwd_solve", {}).get("num_warps"),
                 x.get("fwd_solve", {}).get("rows"), x.get("grads", {}).get("BC"),
                 x.get("grads", {}).get("num_warps")) for x in launches}
    assert settings == {(None, None, None, None, None), (4, 4, 64, None, None), (4, 4, 32, None, None),
                        (None, None, 32, None, None), (None, None, None, 128, None), (None, None, None, 64, None),
                        (None, None, None, 32, None), (None, None, None, 32, 4), (None, None, None, 32, 16)}
    assert sum(x.get("bwd_solve", {}).get("rows") == 64 for x in launches) == 1
    assert sum(x.get("prec") == "tf32x3" for x in launches) == 1


def test_the_candidates_sweep_changes_one_default_a_run():
    from pathlib import Path

    from harness.sweep import expand, load_sweep
    from kernels.common.launch import DEFAULTS, as_dict

    plan = expand(load_sweep(Path(__file__).parents[2] / "configs" / "kernels-launch-candidates.yaml"), "cuda")
    changed = [(p.mixer, p.config["launch"], p.config["phases"]) for p in plan.points]
    # the defaults the untimed candidates are read against (no change), then candidate 43: GDN's
    # training forward fused from 128 sequences of heads, P coming from wy_fwd; 44: lin_gdn with
    # GDN's P formed by wy_fwd (its default now, untimed for lin_gdn) and without; 45-46: GDN's
    # training fused pass on 32-column V-blocks at K = 128 (max_state 4,096), and that from 128
    # sequences of heads too; 47: GDN's backward state pass on 32-column V-blocks; 45-47 at K = 128 only
    capped = {"max_state": 4096}
    assert changed == [("gdn", {}, ["fwdbwd"]), ("deltanet", {}, ["fwdbwd"]),
                       ("gdn", {"gated_delta_rule": {"fused_fwd": {"min_heads": 128}}}, ["fwdbwd"]),
                       ("lin_gdn", {}, ["fwdbwd"]), ("lin_gdn", {"gated_delta_rule": {"p_in_wy": False}}, ["fwdbwd"]),
                       ("gdn", {"gated_delta_rule": {"fused_fwd": capped}}, ["fwdbwd"]),
                       ("gdn", {"gated_delta_rule": {"fused_fwd": {**capped, "min_heads": 128}}}, ["fwdbwd"]),
                       ("gdn", {"gated_delta_rule": {"state_bwd": {"BV": 32}}}, ["fwdbwd"])]
    assert [p.config["heads"] for p in plan.points[-3:]] == [[{"num_heads": 16, "head_dim": 128}]] * 3
    # what won once timed became a default: the narrowing rule and dk's share in bf16 for both
    # delta rules, GDN's backward pass at DeltaNet's stages with the row factors on the V side
    # (dU_local kept in its own launch at K = 128), fused dv and three forward stages at K <= 64,
    # a scalar gate's decay on the value rows in the segments and above K = 64, its fused pass
    # and both ops' backward state pass narrowed below one wave only, linear's segments at 64 sequences of heads, lin_gdn's
    # running-mean scans in segments at up to 64, its mean's dots into the output's tile within one wave
    delta, gated = as_dict(DEFAULTS["delta_rule"]), as_dict(DEFAULTS["gated_delta_rule"])
    for rule in (delta, gated):
        assert rule["seq"]["min_waves"] == 1 and rule["dqkw"]["dk_part_16bit"]
        assert (rule["state_bwd"]["few_program_stages"], rule["state_bwd"]["few_program_waves"]) == (3, 1)
    assert gated["state_bwd"]["factors_on_v"] and gated["state_bwd"]["max_K"] == 64
    # both delta rules' chunk-parallel kernels heads first from 256 chunks on; MesaNet's adjoint
    # CG at 64 rows a program up to K = 64
    for rule in (delta, gated):
        assert (rule["heads_first"], rule["heads_first_from_chunks"]) == (False, 256)
    # GDN's dqkw over 32-column V-blocks up to K = 64 (candidate 27; DeltaNet's, candidate 28,
    # was slower); dqkw one program a K-block, apart from wy_bwd (k_loop and fuse_wy_bwd, candidates
    # 29-34, no faster)
    assert (gated["dqkw"]["narrow_BV"], gated["dqkw"]["narrow_max_K"]) == (32, 64) and delta["dqkw"]["narrow_BV"] == 0
    assert not any(rule["dqkw"][name] for rule in (gated, delta) for name in ("k_loop", "fuse_wy_bwd"))
    # P formed by wy_fwd for GDN above K = 64 (candidate 38; 35-37, 39-40 slower); wy_fwd on one
    # warp up to K = 64 for both rules (41-42)
    assert (gated["p_in_wy"], gated["p_above_K"], gated["store_p"]) == (True, 64, False)
    assert not delta["p_in_wy"] and not delta["store_p"]
    for rule in (delta, gated):
        assert (rule["wy_fwd"]["num_warps"], rule["wy_fwd"]["narrow_num_warps"], rule["wy_fwd"]["narrow_max_K"]) == (2, 1, 64)
    bwd_solve = as_dict(DEFAULTS["mesa"])["bwd_solve"]
    assert (bwd_solve["rows"], bwd_solve["narrow_rows"], bwd_solve["narrow_max_K"]) == (32, 64, 64)
    lin = as_dict(DEFAULTS["linearized_softmax_gdn"])
    assert (lin["mean_form"], lin["mean_in_acc"]) == ("auto", "one_wave")
    prep = as_dict(DEFAULTS["linearized_softmax_gdn"])["prep"]
    assert (prep["segment_rows"], prep["segment_max_heads"]) == (2048, 64)
    fused = as_dict(DEFAULTS["linear_attention"])["fwd_fused"]
    assert fused["min_heads"] == 128
    for op in ("linear_attention", "gated_linear_attention"):
        assert as_dict(DEFAULTS[op])["bwd_states"]["min_waves"] == 1
    scalar = as_dict(DEFAULTS["gated_linear_attention"])["fwd_fused_scalar"]
    assert scalar["decay_on_v"] and not scalar["narrow_decay_on_v"] and scalar["min_waves"] == 1
    gla = as_dict(DEFAULTS["gated_linear_attention"])
    assert gla["bwd_dqk"]["fuse_dv"] and as_dict(DEFAULTS["linear_attention"])["bwd_dqk"]["fuse_dv"]
    assert (gla["bwd_dqk"]["BK"], gla["fwd_fused_scalar"]["narrow_num_stages"]) == (64, 3)


def test_the_gpu_sweep_times_every_op_and_both_gla_gates():
    from pathlib import Path

    from harness.sweep import expand, load_sweep

    plan = expand(load_sweep(Path(__file__).parents[2] / "configs" / "kernels-gpu.yaml"), "cuda")
    runs = {(p.mixer, p.config["mixer"].get("gate")) for p in plan.points}
    assert {m for m, _ in runs} == {"softmax", "linear", "gla", "deltanet", "gdn", "lin_gdn", "mesa"}
    assert ("gla", "scalar") in runs and len(plan.points) == 8


def test_the_spill_sweep_changes_one_kernel_group_per_run():
    from pathlib import Path

    from harness.sweep import expand, load_sweep
    from kernels.common.launch import DEFAULTS, as_dict

    plan = expand(load_sweep(Path(__file__).parents[2] / "configs" / "kernels-launch-spills.yaml"), "cuda")
    assert len(plan.points) == len({p.key for p in plan.points}) == 5
    default = as_dict(DEFAULTS["gated_delta_rule"])
    for p in plan.points:
        changes = p.config["launch"]["gated_delta_rule"]
        assert changes and all(name in default for name in changes)
        assert any(default[name][field] != value for name, fields in changes.items() for field, value in fields.items())


def test_the_gated_sweep_times_gdn_and_scalar_gla_beside_fla():
    from pathlib import Path

    from harness.sweep import expand, load_sweep

    plan = expand(load_sweep(Path(__file__).parents[2] / "configs" / "kernels-gpu-gated.yaml"), "cuda")
    assert [(p.mixer, p.config["mixer"].get("gate")) for p in plan.points] == [("gdn", None), ("gla", "scalar")]
    assert all(p.config["compare"] == ["fla"] and p.config["phases"] == ["fwd", "fwdbwd"] for p in plan.points)
