"""benchmarks.resume_pick: which saved training states a device call brings back."""
from pathlib import Path

import torch

from benchmarks.resume_pick import pick


def _state(root: Path, name: str, step: int, total: int, floats: int) -> Path:
    folder = root / "mqar" / name
    folder.mkdir(parents=True)
    torch.save({"version": 1, "total_steps": total, "progress": {"step": step},
                "model": {"w": torch.randn(floats)}}, folder / "train_state.pt")
    return folder


def test_furthest_along_first_within_the_budget(tmp_path):
    _state(tmp_path, "a-cuda", 100, 1000, 50_000)
    _state(tmp_path, "b-cuda", 900, 1000, 50_000)
    _state(tmp_path, "c-cuda", 500, 1000, 50_000)
    one = (tmp_path / "mqar" / "a-cuda" / "train_state.pt").stat().st_size
    assert pick(tmp_path, 3 * one + 1000) == [Path("mqar/b-cuda"), Path("mqar/c-cuda"), Path("mqar/a-cuda")]
    assert pick(tmp_path, 2 * one + 1000) == [Path("mqar/b-cuda"), Path("mqar/c-cuda")]
    assert pick(tmp_path, one // 2) == []


def test_an_unreadable_state_is_left_out_and_said(tmp_path, capsys):
    _state(tmp_path, "good-cuda", 10, 100, 1000)
    bad = tmp_path / "mqar" / "bad-cuda"
    bad.mkdir(parents=True)
    (bad / "train_state.pt").write_bytes(b"cut short")
    assert pick(tmp_path, 10 * 2**20) == [Path("mqar/good-cuda")]
    assert "bad-cuda" in capsys.readouterr().err
