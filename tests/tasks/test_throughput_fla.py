"""The throughput task's FLA column (`compare=[fla]`) on the CPU, through a stand-in `fla`
package: FLA itself needs CUDA, so without this the column's plumbing would first run on a
GPU. The stand-ins take exactly the parameters of FLA 0.6.0's chunk kernels (names and
order as in that release) and compute with our torch ops, so a call the harness makes with
a wrong name, order or shape fails here."""

import sys
import types

import pytest
import torch

import tasks.throughput as throughput_module
from harness.config import resolve_config
from kernels import delta_rule, gated_delta_rule, gated_linear_attention, linear_attention, mesa
from tasks.base import RunContext
from tasks.throughput import Throughput


def _stand_in_fla(calls: list) -> types.ModuleType:
    def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True,
                          cu_seqlens=None):
        calls.append("chunk_linear_attn")
        o, _ = linear_attention(q, k, torch.cat([v, torch.ones_like(v[..., :1])], -1) if normalize else v,
                                scale=scale, backend="torch")
        return (o[..., :-1] / o[..., -1:] if normalize else o), None

    def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
                  cu_seqlens=None, cu_seqlens_cpu=None):
        calls.append("chunk_gla")
        assert g.shape == k.shape, "vector gate: [B, T, H, K]"
        return gated_linear_attention(q, k, v, g, scale=scale, backend="torch")[0], None

    def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                         state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
        calls.append("chunk_simple_gla")
        assert g is not None and g.shape == k.shape[:3], "scalar gate: [B, T, H]"
        return gated_linear_attention(q, k, v, g, scale=scale, backend="torch")[0], None

    def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
        calls.append("chunk_delta_rule")
        return delta_rule(q, k, v, beta, scale=scale, backend="torch")[0], None

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                               allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                               chunk_indices=None, cp_context=None, **kwargs):
        calls.append("chunk_gated_delta_rule")
        return gated_delta_rule(q, k, v, g, beta, scale=scale, backend="torch")[0], None

    def chunk_mesa_net(q, k, v, g, beta, lamb, h_kk_init=None, h_kv_init=None, output_final_state=False,
                       max_CG_iteration=30, use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None):
        calls.append("chunk_mesa_net")
        assert lamb.shape == (q.shape[2], q.shape[3]), "lamb: [H, K]"
        return mesa(q, k, v, g, beta, lamb, cg_steps=max_CG_iteration, backend="torch")[0], None

    fla, ops = types.ModuleType("fla"), types.ModuleType("fla.ops")
    fla.ops = ops
    for sub, fn in (("linear_attn", chunk_linear_attn), ("gla", chunk_gla), ("simple_gla", chunk_simple_gla),
                    ("delta_rule", chunk_delta_rule), ("gated_delta_rule", chunk_gated_delta_rule),
                    ("mesa_net", chunk_mesa_net)):
        module = types.ModuleType(f"fla.ops.{sub}")
        setattr(module, fn.__name__, fn)
        setattr(ops, sub, module)
    return fla


@pytest.fixture
def fla_calls(monkeypatch):
    calls: list[str] = []
    fla = _stand_in_fla(calls)
    monkeypatch.setitem(sys.modules, "fla", fla)
    monkeypatch.setitem(sys.modules, "fla.ops", fla.ops)
    monkeypatch.setattr(throughput_module, "fla_status", lambda device: None)
    monkeypatch.setattr(throughput_module, "_SHARED", {})
    return calls


def _run(tmp_path, mixer, **options):
    sets = ["compare=[fla]", "modes=[op]", "sweeps=[budget]", "phases=[fwd,fwdbwd]"]
    sets += [f"mixer.{k}={v}" for k, v in options.items()]
    cfg = resolve_config(Throughput, "tiny", None, sets)
    ctx = RunContext(mixer=mixer, config=cfg, device=torch.device("cpu"), seed=0, artifact_dir=tmp_path)
    return Throughput().run(ctx)


@pytest.mark.parametrize("mixer,options,kernel", [
    ("linear", {}, "chunk_linear_attn"),
    ("gla", {}, "chunk_gla"),
    ("gla", {"gate": "scalar"}, "chunk_simple_gla"),
    ("deltanet", {}, "chunk_delta_rule"),
    ("gdn", {}, "chunk_gated_delta_rule"),
    ("mesa", {"cg_steps": 4}, "chunk_mesa_net"),
])
def test_fla_column_calls_fla_with_its_own_signature(tmp_path, fla_calls, mixer, options, kernel):
    result = _run(tmp_path, mixer, **options)
    assert result.details["baselines"]["fla"] == "ok"
    points = result.details["points"]
    for p in points:
        col = p["baselines"]["fla"]
        assert col["status"] == "ok", col.get("error")
        assert col["kernel"] == kernel and col["ms"] > 0
        assert col["speedup"] == pytest.approx(col["ms"] / p["ms"])
    assert set(fla_calls) == {kernel}
    assert {p["phase"] for p in points} == {"fwd", "fwdbwd"}


def test_mixers_without_an_fla_kernel_get_a_skipped_column(tmp_path, fla_calls):
    points = _run(tmp_path, "lin_gdn").details["points"]
    assert all(p["baselines"]["fla"]["status"] == "skipped" for p in points)
    assert "no kernel" in points[0]["baselines"]["fla"]["error"] and fla_calls == []
