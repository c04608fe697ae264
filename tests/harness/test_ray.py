"""The Ray executor on the CPU with a local Ray: the same records as the in-process executor.

Ray probes public addresses when it starts, so the test body runs in a fresh network
namespace where only loopback exists: the test re-runs itself under `unshare -n` (or
`unshare -rn` without root) and skips cleanly where that is not possible or Ray is absent."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "smoke-cpu.yaml"
INSIDE = os.environ.get("HARNESS_TEST_NETNS") == "1"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[ray]')")


def _netns_prefix() -> list[str] | None:
    """A command prefix that runs its arguments in a new network namespace with loopback up."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    for flags in (["-n"], ["-rn"]):
        probe = subprocess.run(["unshare", *flags, "ip", "link", "set", "lo", "up"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", *flags, "sh", "-c", 'ip link set lo up && exec "$@"', "netns"]
    return None


def test_ray_executor_on_cpu(tmp_path, monkeypatch):
    if not INSIDE:
        prefix = _netns_prefix()
        if prefix is None:
            pytest.skip("needs `unshare -n` (or -rn) and `ip` to run Ray with loopback only")
        env = {**os.environ, "HARNESS_TEST_NETNS": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
               "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "WANDB_MODE": "disabled"}
        test_id = f"{Path(__file__).resolve()}::test_ray_executor_on_cpu"
        out = subprocess.run([*prefix, sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test_id,
                              "--basetemp", str(tmp_path / "inner")],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
        assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]
        return

    from harness.executors import RayExecutor
    from harness.sweep import SweepFile, expand, load_sweep, run_sweep

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))  # inherited by the local Ray's workers
    smoke = expand(load_sweep(SMOKE), "cpu")
    broken = expand(SweepFile(mixers=["gdn"], grid=[{"tasks": ["mqar"], "presets": ["tiny"],
                                                      "set": {"optim.lr": 1.0e30}}]), "cpu")  # diverges
    smoke.points += broken.points
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must stay under 107 bytes
    res = tmp_path / "res"
    try:
        executor = RayExecutor("auto", wandb=False, init_kwargs={"num_cpus": 2, "_temp_dir": ray_tmp})
        try:
            assert executor.device_type == "cpu" and executor.slots == 2
            summary = run_sweep(smoke, executor, res)
            again = run_sweep(smoke, executor, res)
        finally:
            executor.close()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert sorted(o.status for _, o in summary.ran) == ["diverged", "ok", "ok"]
    assert again.ran == [] and again.done_before == 3 and len(again.failed_before) == 0
    recs = [json.loads(p.read_text()) for p in sorted((res / "runs").glob("*/*.json"))]
    assert sorted(f"{r['config_hash']}-cpu" for r in recs) == sorted(p.key for p in smoke.points)
    for r in recs:  # the records the in-process executor writes, written back here by the driver
        assert r["device"].startswith("cpu") and r["versions"]["torch"]
        if r["status"] == "ok":
            assert r["backend"] == "torch" and 0 <= r["metrics"]["accuracy"] <= 1
        else:
            assert r["status"] == "diverged" and "TrainingDiverged" in r["error"]
