"""benchmarks.kernels_table: the table holds each op's default launch settings, not a variant's, and
names each row's device (and Triton) where its rows come from several."""
import time

import torch

from benchmarks.kernels_table import _newest, table
from harness.config import resolve_config
from harness.records import write_record
from harness.runner import RunSpec, execute
from harness.tracking import Tracker
from tasks.kernels import Kernels


def _record(tmp_path, *sets):
    cfg = resolve_config(Kernels, "tiny", None, ["backends=[torch]", "seq_lens=[16]", "phases=[fwd]", *sets])
    record, _ = execute(RunSpec("linear", Kernels, "tiny", cfg, torch.device("cpu"), 0), tmp_path, Tracker(enabled=False))
    assert record.status == "ok", record.error
    return record


def test_a_newer_launch_variant_does_not_replace_the_default(tmp_path):
    default = _record(tmp_path)
    time.sleep(1.1)  # records' times are whole seconds
    variant = _record(tmp_path, "launch.linear_attention.fwd_output.BV=32")
    assert variant.finished > default.finished
    newest = _newest(tmp_path, "cpu")
    assert newest[("linear_attention", "default")].run_id == default.run_id


def test_a_newer_record_of_ours_alone_does_not_replace_one_beside_the_peer(tmp_path):
    beside = _record(tmp_path, "compare=[fla]")  # FLA absent here: the record says so
    time.sleep(1.1)
    alone = _record(tmp_path, "compare=[]")
    assert alone.finished > beside.finished and alone.config["compare"] == []
    assert _newest(tmp_path, "cpu")[("linear_attention", "default")].run_id == beside.run_id


def _linear_and_gdn(tmp_path):
    """A linear and a gdn record of the kernels task on the CPU, and their (H, K)."""
    linear = _record(tmp_path)
    gdn_cfg = resolve_config(Kernels, "tiny", None, ["backends=[torch]", "seq_lens=[16]", "phases=[fwd]"])
    gdn, _ = execute(RunSpec("gdn", Kernels, "tiny", gdn_cfg, torch.device("cpu"), 0), tmp_path, Tracker(enabled=False))
    return linear, gdn, (linear.details["points"][0]["H"], linear.details["points"][0]["K"])


def test_rows_from_several_devices_name_theirs(tmp_path):
    linear, gdn, heads = _linear_and_gdn(tmp_path)
    one_device = table(tmp_path, "cpu", heads, peer_name="torch")
    assert " record |" not in one_device.splitlines()[0]
    # the same gdn record, as if another CPU had run it
    write_record(tmp_path, gdn.model_copy(update={"device": "cpu: other model"}))
    lines = table(tmp_path, "cpu", heads, peer_name="torch").splitlines()
    assert lines[0].endswith(" record |")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:4]}
    assert rows["gated_delta_rule"].endswith(f" cpu: other model, {gdn.git_commit[:7]} |")
    assert rows["linear_attention"].endswith(f" {linear.device}, {linear.git_commit[:7]} |")


def test_rows_from_several_tritons_name_theirs(tmp_path):
    linear, gdn, heads = _linear_and_gdn(tmp_path)
    # the same gdn record, as if a carried Triton had run it (benchmarks/triton_carry.sh)
    write_record(tmp_path, gdn.model_copy(update={"versions": {**gdn.versions, "triton": "9.9.9"}}))
    lines = table(tmp_path, "cpu", heads, peer_name="torch").splitlines()
    assert lines[0].endswith(" record |")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:4]}
    assert rows["gated_delta_rule"].endswith(f" {gdn.device}, {gdn.git_commit[:7]}, Triton 9.9.9 |")
    assert rows["linear_attention"].endswith(f", Triton {linear.versions.get('triton')} |")
    assert "triton 9.9.9" in lines[-1]
