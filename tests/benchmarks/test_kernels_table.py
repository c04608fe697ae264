"""benchmarks.kernels_table: the table holds each op's default launch settings, not a variant's."""
import time

import torch

from benchmarks.kernels_table import _newest
from harness.config import resolve_config
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
