"""`harness compare` on hand-made records with known regressions: directions from metric
names, the threshold, newest ok record per key, failed runs, exit codes."""

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from harness.compare import HIGHER, LOWER, CompareError, compare, direction, parse_threshold
from harness.records import RunRecord, write_record
from harness.sweep_cli import compare_cmd, sweep_cmd

app = typer.Typer()
app.command("sweep")(sweep_cmd)  # as harness.cli registers them
app.command("compare")(compare_cmd)
cli = CliRunner()

MQAR_SETTING = {"vocab_size": 128, "power_a": 0.01, "random_non_queries": True,
                "train": [{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 512}],
                "test": [{"seq_len": 32, "num_kv_pairs": 4, "num_examples": 128}]}
_count = 0


def _record(results: Path, mixer: str, metrics: dict, task: str = "mqar", status: str = "ok",
            finished: str = "2026-01-01T00:00:00+00:00", config: dict | None = None, device: str = "NVIDIA H200") -> None:
    global _count
    _count += 1
    write_record(results, RunRecord(
        run_id=f"r{_count:04d}-{task}-{mixer}", config_hash="0" * 16, mixer=mixer, task=task, preset="tiny",
        config=config if config is not None else {**MQAR_SETTING, "optim": {"lr": 1e-3}}, metrics=metrics, backend="triton",
        device=device, versions={}, git_commit=None, seed=0, started=finished, finished=finished, duration_s=1.0,
        status=status, error=None if status == "ok" else "boom",
    ))


@pytest.mark.parametrize("name,way", [
    ("fwd_ms@1024", LOWER), ("op_fwdbwd_ms@65536", LOWER), ("train_time_s", LOWER), ("peak_bytes", LOWER),
    ("peak_memory_fwdbwd@4096", LOWER), ("state_mib", LOWER), ("points_failed", LOWER),
    ("accuracy", HIGHER), ("accuracy_kv8", HIGHER), ("swap_accuracy_linear", HIGHER),
    ("fwdbwd_tokens_per_s", HIGHER), ("op_fwd_tflops", HIGHER),
    ("params", None), ("crossover_T_fwd", None), ("fwd_speedup_vs_softmax", None), ("final_loss", None),
])
def test_direction_from_name(name, way):
    assert direction(name) == way


def test_threshold_parsing():
    assert parse_threshold("5%") == pytest.approx(0.05)
    assert parse_threshold("0.05") == pytest.approx(0.05)
    assert parse_threshold("10") == pytest.approx(0.10)
    for bad in ("fast", "-5%"):
        with pytest.raises(CompareError, match="threshold"):
            parse_threshold(bad)


@pytest.fixture
def sides(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    # gdn: 10% slower and 10% fewer tokens/s -> regressions at 5%, not at 15%; 4.4% less accurate: within 5%
    _record(base, "gdn", {"fwd_ms@1024": 10.0, "fwd_tokens_per_s": 1000.0, "accuracy": 0.90, "params": 100.0},
            finished="2026-01-01T00:00:00+00:00")
    _record(base, "gdn", {"fwd_ms@1024": 99.0, "fwd_tokens_per_s": 1.0, "accuracy": 0.10, "params": 1.0},
            finished="2025-12-01T00:00:00+00:00")  # older: ignored
    _record(new, "gdn", {"fwd_ms@1024": 11.0, "fwd_tokens_per_s": 900.0, "accuracy": 0.86, "params": 300.0})
    # linear: faster and less memory -> improvements; an unknown metric changed a lot -> not gated
    _record(base, "linear", {"fwd_ms@1024": 10.0, "peak_bytes": 2e9, "crossover_T_fwd": 512.0})
    _record(new, "linear", {"fwd_ms@1024": 8.0, "peak_bytes": 1e9, "crossover_T_fwd": 4096.0})
    _record(new, "linear", {"fwd_ms@1024": 80.0, "peak_bytes": 9e9, "crossover_T_fwd": 1.0},
            status="failed", finished="2026-02-01T00:00:00+00:00")  # a newer failure does not hide the ok run
    # other settings are other keys: a different vocabulary, another device, a task not registered
    _record(base, "softmax", {"accuracy": 0.99}, config={**MQAR_SETTING, "vocab_size": 256})
    _record(new, "softmax", {"accuracy": 0.50}, config={**MQAR_SETTING, "vocab_size": 512})
    _record(new, "gdn", {"accuracy": 0.10}, device="cpu: some CPU")
    _record(base, "mesa", {"widget_ms": 1.0}, task="mystery", config={"anything": 1})
    _record(new, "mesa", {"widget_ms": 1.5}, task="mystery", config={"anything": 2})
    return base, new


def test_compare_finds_the_known_regressions(sides):
    base, new = sides
    result = compare(base, new, 0.05)
    verdicts = {(r.key[1], r.metric): r.verdict for r in result.rows}
    assert verdicts == {
        ("gdn", "fwd_ms@1024"): "regression", ("gdn", "fwd_tokens_per_s"): "regression", ("gdn", "accuracy"): "ok",
        ("gdn", "params"): "not gated",
        ("linear", "fwd_ms@1024"): "improved", ("linear", "peak_bytes"): "improved", ("linear", "crossover_T_fwd"): "not gated",
        ("mesa", "widget_ms"): "regression",  # an unregistered task has no setting fields: one key
    }
    ratio = {(r.key[1], r.metric): r.ratio for r in result.rows}
    assert ratio[("gdn", "fwd_ms@1024")] == pytest.approx(1.1) and ratio[("gdn", "accuracy")] == pytest.approx(0.86 / 0.9)
    assert len(result.regressions) == 3
    assert [k[1] for k in result.only_base] == ["softmax"] and sorted(k[1] for k in result.only_new) == ["gdn", "softmax"]
    assert {r.key[1] for r in compare(base, new, 0.15).regressions} == {"mesa"}  # +50%
    assert {r.metric for r in compare(base, new, 0.05, ignore=["*_ms*"]).regressions} == {"fwd_tokens_per_s"}


def test_failed_in_new_is_a_regression(tmp_path):
    base, new = tmp_path / "base", tmp_path / "new"
    _record(base, "gdn", {"accuracy": 0.9})
    _record(new, "gdn", {}, status="failed")
    result = compare(base, new, 0.05)
    assert [(r.metric, r.verdict) for r in result.rows] == [("status", "failed")]
    # NaN where there was a number is a regression as well
    _record(new, "gdn", {"accuracy": float("nan")})
    assert [r.verdict for r in compare(base, new, 0.05).rows] == ["regression"]


def test_compare_cli_exit_codes_and_markdown(sides, tmp_path):
    base, new = sides
    report = tmp_path / "report" / "compare.md"
    out = cli.invoke(app, ["compare", str(base), str(new), "--threshold", "5%", "--markdown", str(report)])
    assert out.exit_code == 1, out.output
    text = " ".join(out.output.split())
    assert "3 regression(s) beyond 5.0%" in text and "+10.0%" in text
    assert "| gdn |" in report.read_text() and "regression" in report.read_text()
    out = cli.invoke(app, ["compare", str(base), str(new), "--threshold", "60%"])
    assert out.exit_code == 0, out.output
    assert "no regression" in out.output
    one = next(base.glob("runs/mqar/*gdn*.json"))  # a single record file works as a side
    assert cli.invoke(app, ["compare", str(one), str(one)]).exit_code == 0
    for args, needle in ([str(tmp_path / "nope"), str(new)], "does not exist"), \
                        ([str(base), str(new), "--threshold", "x"], "threshold"), \
                        ([str(tmp_path / "report"), str(new)], "no run records"):
        out = cli.invoke(app, ["compare", *args])
        assert out.exit_code == 2 and needle in " ".join(out.output.split()) and "Traceback" not in out.output
    lone = tmp_path / "lone"
    _record(lone, "gla", {"accuracy": 0.5})
    out = cli.invoke(app, ["compare", str(base), str(lone)])
    assert out.exit_code == 2 and "no run in common" in " ".join(out.output.split())
