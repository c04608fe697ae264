"""The memory task: the CPU measurement sees real allocations, out-of-memory and crashed
probes are results, the record and its plots (CPU, the tiny preset)."""

import json
import math
import os
from dataclasses import dataclass

import pytest
import torch

from harness.config import resolve_config
from harness.runner import RunSpec, execute
from harness.tracking import Tracker
from tasks.common.memprobe import Probe, _run_probes, cache_bytes, peak_memory
from tasks.memory import Memory

MiB = 2**20
PNG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Allocate:
    """A workload for the child process: probe.T MiB written in one tensor; mode 'die' kills
    the process, mode 'oom' raises torch's out-of-memory error."""

    def setup(self, device):
        return None

    def call(self, state, probe):
        def run():
            if probe.mode == "die" and probe.T > 1:  # warm-up calls use the smallest T (1)
                os._exit(3)
            if probe.mode == "oom" and probe.T > 1:
                raise torch.OutOfMemoryError("simulated out of memory")
            return torch.ones(probe.T * MiB // 4, dtype=torch.float32).sum()

        return run


# One sweep through child processes (each start costs seconds): large allocations, a cap
# of 300 MiB, a simulated out-of-memory and a child that dies, in that order.
PROBES = [
    Probe("alloc", 200), Probe("alloc", 40), Probe("alloc", 400), Probe("alloc", 500),
    Probe("oom", 1), Probe("oom", 2), Probe("oom", 3),
    Probe("die", 1), Probe("die", 2), Probe("alloc", 4),
]


@pytest.fixture(scope="module")
def swept():
    out = peak_memory(Allocate(), PROBES, torch.device("cpu"), max_bytes=300 * MiB)
    assert len(out) == len(PROBES)
    return {(r["mode"], r["T"]): r for r in out}


def test_child_measurement_sees_a_large_allocation_and_resets_between_probes(swept):
    big, small = swept[("alloc", 200)], swept[("alloc", 40)]
    assert big["status"] == small["status"] == "ok", (big, small)
    assert 195 <= big["peak_bytes"] / MiB <= 230, big
    assert 38 <= small["peak_bytes"] / MiB <= 60, "the second probe must not inherit the first one's peak"


def test_cap_and_simulated_oom_are_results_and_larger_T_are_skipped(swept):
    over = swept[("alloc", 400)]
    assert over["status"] == "oom" and ("allocate" in over["error"] or "max_bytes" in over["error"]), over
    assert swept[("alloc", 500)]["status"] == "skipped" and "T=400" in swept[("alloc", 500)]["error"]
    assert [swept[("oom", T)]["status"] for T in (1, 2, 3)] == ["ok", "oom", "skipped"]
    assert "OutOfMemoryError" in swept[("oom", 2)]["error"]


def test_a_child_that_dies_fails_its_probe_and_the_sweep_goes_on(swept):
    assert swept[("die", 1)]["status"] == "ok"
    assert swept[("die", 2)]["status"] == "failed" and "died (exit code 3)" in swept[("die", 2)]["error"]
    after = swept[("alloc", 4)]
    assert after["status"] == "ok" and after["peak_bytes"] >= 3 * MiB, "a new child measures the probes left"


def test_in_process_probes_oom_path():
    def measure(probe):
        if probe.T >= 32:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return {"mode": probe.mode, "T": probe.T, "status": "ok", "peak_bytes": probe.T, "error": None, "method": "x"}

    probes = [Probe("layer", 16), Probe("layer", 32), Probe("layer", 64), Probe("op", 16)]
    out = list(_run_probes(probes, measure, max_bytes=None))
    assert [r["status"] for r in out] == ["ok", "oom", "skipped", "ok"]
    assert "larger than T=32" in out[2]["error"]
    capped = list(_run_probes([Probe("op", 16)], measure, max_bytes=8))
    assert capped[0]["status"] == "oom" and "max_bytes" in capped[0]["error"]


def test_cache_bytes_counts_nested_tensors():
    cache = ((torch.zeros(2, 3), None), {"h": torch.zeros(4, dtype=torch.float64)}, 7)
    assert cache_bytes(cache) == 2 * 3 * 4 + 4 * 8


def test_record_structure_and_plots(tmp_path):
    cfg = resolve_config(Memory, "tiny", None, ["max_seq_len=64", "modes=[op, layer]"])
    record, path = execute(RunSpec("gdn", Memory, "tiny", cfg, torch.device("cpu"), 0), tmp_path, Tracker(enabled=False))
    assert record.status == "ok", record.error
    data = json.loads(path.read_text())
    m = data["metrics"]
    # (readings of a few KiB are at the resolution of resident-set counting)
    for key in ("peak_mib", "peak_mib@16", "peak_mib@64", "op_peak_mib", "max_T_fits", "state_bytes", "peak_ratio_vs_softmax"):
        assert key in m and math.isfinite(m[key]) and m[key] >= 0, key
    assert m["peak_mib@64"] > 0.1
    assert m["max_T_fits"] == 64
    points = data["details"]["points"]
    assert {p["model"] for p in points} == {"gdn", "softmax"} and len(points) == 2 * 2 * 3
    assert all(p["status"] == "ok" for p in points), points
    states = data["details"]["decode_state"]
    # A recurrent state is the same size at every context; a KV cache grows with it.
    assert len({s["state_bytes"] for s in states}) == 1
    assert states[-1]["softmax_state_bytes"] > states[0]["softmax_state_bytes"]
    assert data["artifacts"] and all(
        (tmp_path / "runs" / "memory" / a).read_bytes().startswith(PNG) for a in data["artifacts"])


def test_config_rejects_a_short_max_seq_len():
    with pytest.raises(Exception, match="max_seq_len"):
        resolve_config(Memory, "default", None, ["max_seq_len=100"])


def test_decode_state_stage_runs_under_the_cap_and_the_timeout():
    """The prefill probes of the decode-state stage go through the same child processes: a KV
    cache over max_bytes is an oom result and the longer lengths are skipped, not measured."""
    from tasks.common.memprobe import MixerPrefillState
    from tasks.common.workloads import LayerSpec

    spec = LayerSpec(num_heads=2, head_dim=64, d_model=128, dtype=torch.float32)
    probes = [Probe("state", 16), Probe("state", 200_000), Probe("state", 400_000)]
    out = peak_memory(MixerPrefillState("softmax", spec, 0), probes, torch.device("cpu"), max_bytes=64 * MiB)
    workload = MixerPrefillState("softmax", spec, 0)
    in_process = workload.call(workload.setup(torch.device("cpu")), probes[0])()
    assert out[0]["status"] == "ok" and out[0]["value"] == in_process >= 2 * 16 * 2 * 64 * 4  # K and V at least
    assert out[1]["status"] == "oom", out[1]
    assert out[2]["status"] == "skipped" and "T=200000" in out[2]["error"]
    recurrent = peak_memory(MixerPrefillState("gdn", spec, 0), probes[:1], torch.device("cpu"), timeout_s=0.001)
    assert recurrent[0]["status"] == "failed" and "timed out" in recurrent[0]["error"]
