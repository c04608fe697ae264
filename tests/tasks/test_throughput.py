"""The throughput task: record structure, one failing point, out-of-memory handling,
crossover arithmetic, FLOP counts and plots (CPU, the tiny preset)."""

import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import tasks.throughput as throughput_module
from harness.config import resolve_config
from harness.runner import RunSpec, execute
from harness.tracking import Tracker
from tasks.base import RunContext
from tasks.common import flops
from tasks.common.crossover import crossover
from tasks.common.faults import is_oom
from tasks.common.timing import TimingOptions, summarize, time_callable
from tasks.common.workloads import LayerSpec, build_layer
from tasks.throughput import Throughput

PNG = b"\x89PNG\r\n\x1a\n"


def _tiny(**sets):
    return resolve_config(Throughput, "tiny", None, [f"{k}={v}" for k, v in sets.items()])


def _run(tmp_path, mixer="linear", **sets):
    ctx = RunContext(mixer=mixer, config=_tiny(**sets), device=torch.device("cpu"), seed=0, artifact_dir=tmp_path / "art")
    return Throughput().run(ctx)


def test_record_structure(tmp_path):
    spec = RunSpec("gla", Throughput, "tiny", _tiny(), torch.device("cpu"), 0)
    record, path = execute(spec, tmp_path, Tracker(enabled=False))
    assert record.status == "ok", record.error
    data = json.loads(path.read_text())
    assert data["backend"] == "torch" and data["task"] == "throughput"
    m = data["metrics"]
    for key in ("fwd_ms@16", "fwd_ms@32", "fwdbwd_ms@32", "decode_ms@32", "op_fwd_ms@32", "fwdbwd_tokens_per_s",
                "fwd_tokens_per_s", "decode_tokens_per_s", "op_fwdbwd_tflops", "points_failed"):
        assert key in m and math.isfinite(m[key]), key
    assert m[Throughput.primary_metric] > 0
    points = data["details"]["points"]
    # 2 modes x (2 sweeps x 2 phases + decode) x 2 lengths
    assert len(points) == 2 * (2 * 2 + 1) * 2
    for p in points:
        assert p["status"] == "ok", p
        assert {"mode", "sweep", "phase", "T", "B", "ms", "tokens_per_s", "softmax_ms", "speedup_vs_softmax"} <= set(p)
        if p["sweep"] == "budget":
            assert p["B"] * p["T"] == 64
    op_budget = [p for p in points if p["mode"] == "op" and p["sweep"] == "budget"]
    assert all(p["baselines"]["sdpa_math"]["status"] == "ok" for p in op_budget)
    assert data["details"]["crossovers"], "every mixer but softmax carries its crossover analysis"
    for name in data["artifacts"]:
        assert (tmp_path / "runs" / "throughput" / name).read_bytes().startswith(PNG)
    assert any("decode" in a for a in data["artifacts"]) and any("budget" in a for a in data["artifacts"])


def _failing_at(T_bad, exc):
    real = throughput_module.make_call

    def make_call(mixer, mode, phase, B, T):
        if T == T_bad and mixer.registry_name != "softmax" and mode == "layer" and phase == "fwd":
            raise exc
        return real(mixer, mode, phase, B, T)

    return make_call


def test_one_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(throughput_module, "make_call", _failing_at(32, ValueError("broken at T=32")))
    result = _run(tmp_path, phases="[fwd]", modes="[layer]", sweeps="[budget]")
    by_T = {p["T"]: p for p in result.details["points"]}
    assert by_T[32]["status"] == "failed" and "ValueError: broken at T=32" in by_T[32]["error"]
    assert by_T[32]["softmax_status"] == "ok", "the baseline of a failed point is still measured"
    assert by_T[16]["status"] == "ok" and by_T[16]["ms"] > 0
    assert "fwd_ms@16" in result.metrics and "fwd_ms@32" not in result.metrics
    assert result.metrics["points_failed"] == 1


def test_out_of_memory_frees_memory_and_continues(tmp_path, monkeypatch):
    freed = []
    monkeypatch.setattr(throughput_module, "free_memory", lambda device: freed.append(device))
    monkeypatch.setattr(throughput_module, "make_call", _failing_at(16, torch.OutOfMemoryError("CUDA out of memory (simulated)")))
    result = _run(tmp_path, phases="[fwd]", modes="[layer]", sweeps="[budget]")
    by_T = {p["T"]: p for p in result.details["points"]}
    assert by_T[16]["status"] == "oom" and "OutOfMemoryError" in by_T[16]["error"]
    assert by_T[32]["status"] == "ok"
    assert freed, "an out-of-memory must free memory before the sweep goes on"


def test_is_oom_recognises_cpu_and_cuda_failures():
    assert is_oom(torch.OutOfMemoryError("x")) and is_oom(MemoryError())
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert not is_oom(RuntimeError("shape mismatch")) and not is_oom(ValueError("out of memory?"))


@pytest.mark.parametrize(
    "points,T,kind",
    [
        # log-ratio +log 2 at 64 and -log 2 at 256: zero exactly halfway in log T, at 128.
        ([(64, 2.0, 1.0), (256, 1.0, 2.0)], 128.0, "interpolated"),
        ([(64, 1.0, 2.0), (128, 1.0, 3.0)], 64.0, "below_grid"),
        ([(64, 2.0, 1.0), (128, 3.0, 1.0)], None, "none"),
        # faster at 64, slower at 128, faster from 256: the crossover is past 128.
        ([(64, 1.0, 2.0), (128, 2.0, 1.0), (256, 1.0, 2.0), (512, 1.0, 4.0)], 181.01933598375618, "interpolated"),
        # a failed point (None) is skipped: the interpolation spans 64 to 256.
        ([(64, 2.0, 1.0), (128, None, 1.0), (256, 1.0, 2.0)], 128.0, "interpolated"),
        # equal times are not "faster".
        ([(64, 1.0, 1.0), (128, 1.0, 1.0)], None, "none"),
        ([(64, None, 1.0)], None, "no_data"),
    ],
)
def test_crossover_on_known_numbers(points, T, kind):
    c = crossover(points)
    assert c.kind == kind
    assert (c.T is None) if T is None else c.T == pytest.approx(T, rel=1e-12)


def test_flop_counts_on_small_cases():
    # Causal softmax: half of the dense QK^T and PV products, which FlopCounterMode counts in full.
    B, T, H, K, V = 2, 8, 3, 4, 5
    q, k, v = torch.randn(B, H, T, K), torch.randn(B, H, T, K), torch.randn(B, H, T, V)
    with FlopCounterMode(display=False) as counter:
        (q @ k.transpose(-1, -2)).softmax(-1) @ v
    assert flops.softmax_forward_flops(B, T, H, K, V) == counter.get_total_flops() / 2
    assert flops.softmax_forward_flops(1, 1, 1, 2, 2, cache_len=3) == 2 * 1 * 3 * 4 + 1 * 4
    assert flops.op_flops("softmax_attention", "fwdbwd", B, T, H, K, V) == 3.5 * counter.get_total_flops() / 2
    # Chunking: 130 tokens in chunks of 64 are two full chunks and one of 2.
    assert flops.chunk_sizes(130, 64) == [(2, 64), (1, 2)] and flops.chunk_sizes(5, 64) == [(1, 5)]
    # Linear attention, one chunk of c: QS + K^T V (2cKV each) + QK^T (2c^2 K) + (QK^T)V (2c^2 V).
    c = 3
    assert flops.chunked_forward_flops("linear_attention", 1, c, 1, K, V, chunk_size=64) == 4 * c * K * V + 2 * c * c * (K + V)
    full_chunk = 4 * 64 * K * V + 2 * 64 * 64 * (K + V)
    assert flops.op_flops("gated_linear_attention", "fwdbwd", 2, 128, 1, K, V, 64) == 3 * 2 * 2 * full_chunk
    assert flops.decode_flops("linear_attention", 2, 3, K, V, context=100) == 2 * 3 * 4 * K * V
    assert flops.decode_flops("softmax_attention", 1, 1, K, V, context=9) == 2 * 10 * (K + V)
    with pytest.raises(ValueError, match="known ops"):
        flops.chunked_forward_flops("nope", 1, 1, 1, 1, 1)


def test_dense_flops_match_torch_flop_counter():
    mixer = build_layer("gdn", LayerSpec(2, 8, 16, torch.float32, {"short_conv": False}), torch.device("cpu"), 0)
    x = torch.randn(3, 5, 16)
    with FlopCounterMode(display=False) as counter:
        for m in mixer.modules():
            if isinstance(m, torch.nn.Linear):
                m(x)
    assert flops.dense_flops(mixer, 15) == counter.get_total_flops()
    op_flops = flops.mixer_flops(mixer, "op", "fwd", 3, 5)
    assert flops.mixer_flops(mixer, "layer", "fwd", 3, 5) == op_flops + counter.get_total_flops()


def test_timer_medians_and_bad_options():
    calls = []
    options = TimingOptions(warmup=2, min_repeats=4, max_repeats=6, target_ms=1e9)
    t = time_callable(lambda: calls.append(1), torch.device("cpu"), options)
    assert t.repeats == 6 and len(calls) == 2 + 6 and t.p20_ms <= t.median_ms <= t.p80_ms
    assert summarize([3.0, 1.0, 2.0]).median_ms == 2.0
    with pytest.raises(ValueError, match="min_repeats"):
        TimingOptions(min_repeats=0)
    with pytest.raises(ValueError, match="sync 'end' or 'each'"):
        TimingOptions(sync="never")
    from tasks.common.timing import TimingConfig

    assert TimingConfig().options().sync == "end" and TimingConfig(sync="each").options().sync == "each"


def test_softmax_is_timed_once_per_process_and_shared(tmp_path, monkeypatch):
    monkeypatch.setattr(throughput_module, "_SHARED", {})
    sets = dict(phases="[fwd]", modes="[op]", sweeps="[budget]")
    first = _run(tmp_path / "a", mixer="linear", **sets).details["points"]
    second = _run(tmp_path / "b", mixer="gla", **sets).details["points"]
    assert not any(p["softmax_reused"] for p in first)
    assert all(p["softmax_reused"] for p in second)
    assert [p["softmax_ms"] for p in first] == [p["softmax_ms"] for p in second]
    for p, q in zip(first, second):
        for name, col in q["baselines"].items():
            assert col["reused"] and col["ms"] == p["baselines"][name]["ms"]
            assert col["speedup"] == pytest.approx(col["ms"] / q["ms"])
    # other timing options are other measurements
    third = _run(tmp_path / "c", mixer="gla", **sets, **{"timing.min_repeats": 3}).details["points"]
    assert not any(p["softmax_reused"] for p in third)
