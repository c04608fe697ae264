"""The run record's `launch` field: the launch settings of every Triton op a run used
(kernels/common/launch/), None for a run that used none."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from harness.config import resolve_config
from harness.records import load_records
from harness.runner import RunSpec, execute
from harness.tracking import Tracker
from kernels.common import launch
from tasks import get_task
from tasks.base import TaskResult


def _spec():
    task = get_task("mqar")
    return RunSpec("gdn", task, "tiny", resolve_config(task, "tiny", None, []), torch.device("cpu"), 0)


def test_a_run_records_the_settings_its_triton_ops_ran_with(tmp_path, monkeypatch):
    spec = _spec()

    def run(self, ctx):  # stands in for a task whose model runs the gated delta rule on Triton
        with launch.launch_settings(gated_delta_rule={"wy_fwd": {"num_warps": 4}}):
            launch.note_launch("gated_delta_rule")
        launch.note_launch("gated_delta_rule")  # later calls of an op add nothing
        return TaskResult(metrics={"accuracy": 1.0}, backend="triton")

    monkeypatch.setattr(spec.task, "run", run)
    record, path = execute(spec, tmp_path, Tracker(enabled=False))
    want = dataclasses.asdict(launch.DEFAULTS["gated_delta_rule"])
    want["wy_fwd"]["num_warps"] = 4
    assert record.launch == {"gated_delta_rule": want}
    assert json.loads(path.read_text())["launch"] == {"gated_delta_rule": want}
    assert [r.launch for _, r in load_records(tmp_path)] == [{"gated_delta_rule": want}]


def test_a_run_without_triton_kernels_records_none(tmp_path, monkeypatch):
    spec = _spec()
    monkeypatch.setattr(spec.task, "run", lambda self, ctx: TaskResult(metrics={"accuracy": 1.0}, backend="torch"))
    record, path = execute(spec, tmp_path, Tracker(enabled=False))
    assert record.launch is None and json.loads(path.read_text())["launch"] is None


def test_settings_are_frozen_and_overrides_scoped():
    default = launch.settings("mesa")
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.prec = "ieee"
    with launch.launch_settings(mesa={"fwd_solve": {"rows": 32}}):
        assert launch.settings("mesa").fwd_solve.rows == 32
        with launch.launch_settings(mesa={"prec": "ieee"}):  # nests on top of the outer change
            assert (launch.settings("mesa").prec, launch.settings("mesa").fwd_solve.rows) == ("ieee", 32)
        assert launch.settings_in_effect(["mesa"])["mesa"]["fwd_solve"]["rows"] == 32
        text = launch.encode("mesa")
    assert launch.settings("mesa") is default
    assert launch.decode("mesa", text).fwd_solve.rows == 32
    json.dumps(launch.settings_in_effect())


@pytest.mark.parametrize("changes, message", [
    ({"nope": 1}, "no setting 'nope'"),
    ({"fwd_solve": {"rows": "many"}}, "expected an integer"),
    ({"fwd_solve": {"operands": "bf16"}}, "operands must be one of"),
    ({"states": {"min_BD": 64, "max_BD": 32}}, "min_BD"),
])
def test_bad_overrides_raise(changes, message):
    with pytest.raises(ValueError, match=message):
        with launch.launch_settings(mesa=changes):
            pass
    with pytest.raises(ValueError, match="no launch settings for op"):
        launch.settings("softmax_attention")
