"""benchmarks.efficiency_table: the README's crossover and memory tables, from the records
(committed H200 records of 2026-11-29 copied into a scratch results folder)."""
import shutil
from pathlib import Path

from benchmarks.efficiency_table import memory_table, throughput_table
from harness.records import RunRecord, write_record

RUNS = Path(__file__).resolve().parents[2] / "results" / "runs"
THROUGHPUT = ["20261129T133724-throughput-gdn-ac279db3-34fb.json", "20261129T133934-throughput-lin_gdn-c34efc87-0f9c.json",
              "20261129T133631-throughput-softmax-27da5ae7-5b76.json"]
MEMORY = ["20261129T133242-memory-softmax-f13f2e29-6094.json", "20261129T134313-memory-gdn-dba8992f-8369.json",
          "20261129T134422-memory-mesa-47919223-c46c.json"]


def _copy(tmp_path: Path, task: str, names: list[str]) -> Path:
    (tmp_path / "runs" / task).mkdir(parents=True)
    for name in names:
        shutil.copy(RUNS / task / name, tmp_path / "runs" / task / name)
    return tmp_path


def _row(table: str, mixer: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"| {mixer} |"))


def test_crossovers_read_from_the_records(tmp_path):
    table = throughput_table(_copy(tmp_path, "throughput", THROUGHPUT), "cuda", "gpu")
    assert _row(table, "gdn") == "| gdn | 7,028 | 4,214 | 13,892 | 11,226 | 1,046 | 11.6 ms |"
    # never faster at the grid's end, and faster from its first length on
    assert _row(table, "lin_gdn").startswith("| lin_gdn | none ≤ 65,536 | none ≤ 65,536 |")
    assert "| ≤ 512 |" in _row(table, "lin_gdn")
    assert "| decode step (layer, B = 16) |" in table.splitlines()[0] and "(softmax: 111.2 ms)" in table.splitlines()[0]
    assert "| softmax |" not in table  # its figures are every row's baseline
    assert table.splitlines()[-1].startswith("NVIDIA H200; 2026-11-29; commits d97eecf;")


def test_the_newest_record_of_a_mixer_counts_and_other_presets_do_not(tmp_path):
    results = _copy(tmp_path, "throughput", THROUGHPUT[:1])
    old = RunRecord.model_validate_json((results / "runs" / "throughput" / THROUGHPUT[0]).read_text())
    crossovers = [dict(c, T=5000.0) if (c["mode"], c["phase"]) == ("op", "fwd") else c for c in old.details["crossovers"]]
    newer = old.model_copy(update={"run_id": old.run_id + "-newer", "finished": "2026-12-01T00:00:00+00:00",
                                   "details": {**old.details, "crossovers": crossovers}})
    write_record(results, newer)
    assert _row(throughput_table(results, "cuda", "gpu"), "gdn").startswith("| gdn | 5,000 | 4,214 |")
    write_record(results, newer.model_copy(update={"run_id": old.run_id + "-tiny", "preset": "tiny",
                                                   "finished": "2026-12-02T00:00:00+00:00"}))
    assert _row(throughput_table(results, "cuda", "gpu"), "gdn").startswith("| gdn | 5,000 |")
    assert throughput_table(results, "cpu", "gpu").startswith("no ok throughput records (device cpu, preset gpu)")


def test_memory_peaks_against_softmax(tmp_path):
    results = _copy(tmp_path, "memory", MEMORY)
    table = memory_table(results, "cuda", "gpu", 65536)
    lines = table.splitlines()
    assert lines[0].startswith("| mixer | layer peak at T = 65,536 |")
    assert lines[2] == "| softmax | 4.27 GiB | 1.00 | 1.51 GiB | 262,144 | 536.91 MB |"
    assert [line.split(" | ")[0] for line in lines[3:5]] == ["| gdn", "| mesa"]  # by peak, softmax first
    assert _row(table, "mesa").startswith("| mesa | 9.05 GiB | 2.12 |")
    assert memory_table(results, "cuda", "gpu").splitlines()[0].startswith("| mixer | layer peak at T = 262,144 |")
    assert "lengths they share: [512," in memory_table(results, "cuda", "gpu", 100)
