"""lm-eval end to end: our tasks through simple_evaluate, `harness eval` writing a record."""

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from harness.eval_cli import eval_cmd
from tasks.base import RunContext
from tasks.common.checkpoint import save_checkpoint
from tasks.common.model import MixerLM
from tasks.common.training import predict, train
from tasks.lm_data import IdTokenizer
from tasks.lm_eval_bridge.export import DataSources, export_task
from tasks.mqar import MQAR

pytest.importorskip("lm_eval")
import lm_eval  # noqa: E402
import lm_eval.tasks  # noqa: E402 - imported before TaskManager is built

from tasks.lm_eval_bridge.model import HarnessLM  # noqa: E402

LIMIT = 12


def _cli():
    app = typer.Typer()
    app.callback()(lambda: None)  # keeps `eval` a subcommand
    app.command("eval")(eval_cmd)
    return app


@pytest.fixture(scope="session")
def mqar_checkpoint(tmp_path_factory):
    """A gdn model trained for seconds on the MQAR tiny preset, saved as the MQAR task would."""
    cfg = MQAR.Config(**{**MQAR.presets["tiny"], "optim": {"epochs": 2, "batch_size": 32, "lr": 1e-2}})
    x, y = MQAR._data(cfg, cfg.train, 0, split=0)
    torch.manual_seed(0)
    model = MixerLM("gdn", cfg.vocab_size, cfg.model)
    train(model, [(x, y)], cfg.optim, RunContext("gdn", cfg, torch.device("cpu"), 0, tmp_path_factory.mktemp("art")))
    meta = {"task": "mqar", "task_config": cfg.model_dump(mode="json"), "seed": 0, "max_length": 32}
    path = tmp_path_factory.mktemp("mqar_ckpt") / "checkpoint"
    return save_checkpoint(path, model.eval(), IdTokenizer(cfg.vocab_size).info(), meta), cfg


@pytest.fixture(scope="session")
def task_manager(tmp_path_factory):
    """One TaskManager for the session over our exported tasks (lm-eval's built-ins not indexed)."""
    sources = DataSources(seed=0)
    root = tmp_path_factory.mktemp("exported")
    folders = [str(export_task(name, sources, root)) for name in ("harness_cloze", "harness_corpus_ppl")]
    return lm_eval.tasks.TaskManager(include_path=folders, include_defaults=False), folders


def _first_docs(folder, n):
    lines = (folder / "test.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


def test_mqar_loglikelihood_greedy_is_the_task_prediction(mqar_checkpoint):
    path, cfg = mqar_checkpoint
    lm = HarnessLM(str(path), batch_size=64)
    x, y = MQAR._data(cfg, cfg.test, 0, split=1)
    correct = predict(lm.model, x, y, 64, torch.device("cpu"))  # what the mqar task scores
    docs = _first_docs(export_task("harness_mqar", DataSources.for_checkpoint(lm.checkpoint.meta)), 10**9)
    pairs = [(lm.context_tokens(d["prompt"]), lm.tokenizer.encode(" " + d["target"])) for d in docs]
    greedy = [g for _, g in lm.score(pairs)]
    want = [bool(correct[d["sequence"], len(d["prompt"].split()) - 1]) for d in docs]
    assert len(docs) == (y != -100).sum().item() and greedy == want
    assert 0 < sum(want) < len(want)  # hits and misses both occur: the comparison means something


def test_simple_evaluate_cloze_and_perplexity(byte_checkpoint, task_manager):
    manager, folders = task_manager
    lm = HarnessLM(str(byte_checkpoint), batch_size=8)
    out = lm_eval.simple_evaluate(model=lm, tasks=["harness_cloze", "harness_corpus_ppl"], limit=LIMIT,
                                  task_manager=manager, bootstrap_iters=0, log_samples=False)
    res = out["results"]
    # Multiple choice: argmax over the choices' loglikelihoods, recomputed directly.
    from pathlib import Path

    hits = 0
    for doc in _first_docs(Path(folders[0]), LIMIT):
        scores = [lm.score([(lm.context_tokens(doc["context"]), lm.tokenizer.encode(" " + c))])[0][0] for c in doc["choices"]]
        hits += int(max(range(4), key=scores.__getitem__) == doc["label"])
    assert res["harness_cloze"]["acc,none"] == pytest.approx(hits / LIMIT)
    # Rolling loglikelihood: bits per byte over the documents.
    texts = [d["text"] for d in _first_docs(Path(folders[1]), LIMIT)]
    from lm_eval.api.instance import Instance

    totals = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])
    bpb = -sum(totals) / sum(len(t.encode()) for t in texts) / torch.log(torch.tensor(2.0)).item()
    assert res["harness_corpus_ppl"]["bits_per_byte,none"] == pytest.approx(bpb, rel=1e-6)


def test_harness_eval_writes_a_record(mqar_checkpoint, tmp_path):
    path, _ = mqar_checkpoint
    results = tmp_path / "results"
    out = CliRunner().invoke(_cli(), ["eval", "--checkpoint", str(path), "--tasks", "harness_mqar,harness_mqar_gen",
                                      "--limit", str(LIMIT), "--device", "cpu", "--results", str(results), "--no-wandb"])
    assert out.exit_code == 0, out.output
    (record_path,) = (results / "runs" / "lm-eval").glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "ok" and record["task"] == "lm-eval" and record["mixer"] == "gdn"
    assert record["config"]["tasks"] == ["harness_mqar", "harness_mqar_gen"] and record["config"]["limit"] == LIMIT
    metrics = record["metrics"]
    # The first LIMIT documents, scored directly: the value is the model's greedy next token.
    lm = HarnessLM(str(path))
    folder = export_task("harness_mqar", DataSources.for_checkpoint(lm.checkpoint.meta))
    docs = _first_docs(folder, LIMIT)
    greedy = [g for _, g in lm.score([(lm.context_tokens(d["prompt"]), lm.tokenizer.encode(" " + d["target"])) for d in docs])]
    assert metrics["harness_mqar/acc"] == pytest.approx(sum(greedy) / LIMIT)
    # Generating: the first number generated is that same greedy token.
    assert metrics["harness_mqar_gen/exact_match_first_number"] == pytest.approx(metrics["harness_mqar/acc"])
    assert metrics["accuracy"] == metrics["accuracy_harness_mqar"] == pytest.approx(metrics["harness_mqar/acc"])
    assert (results / "runs" / "lm-eval" / record["run_id"] / "lm_eval_results.json").exists()


def test_harness_eval_errors(mqar_checkpoint, tmp_path, monkeypatch):
    path, _ = mqar_checkpoint
    cli = _cli()
    out = CliRunner().invoke(cli, ["eval", "--checkpoint", str(tmp_path / "nope.pt"), "--tasks", "harness_mqar",
                                   "--results", str(tmp_path)])
    assert out.exit_code == 2 and "does not exist" in out.output
    out = CliRunner().invoke(cli, ["eval", "--checkpoint", str(path), "--tasks", "", "--results", str(tmp_path)])
    assert out.exit_code == 2 and "--tasks" in out.output
    out = CliRunner().invoke(cli, ["eval", "--checkpoint", str(path), "--tasks", "harness_mqr", "--results", str(tmp_path)])
    assert out.exit_code == 2 and "Did you mean 'harness_mqar'" in out.output
    import tasks.lm_eval_bridge as bridge

    monkeypatch.setattr(bridge, "lm_eval_available", lambda: False)
    out = CliRunner().invoke(cli, ["eval", "--checkpoint", str(path), "--tasks", "harness_mqar", "--results", str(tmp_path)])
    assert out.exit_code == 2 and "pip install -e '.[lm-eval]'" in out.output
    assert not (tmp_path / "runs").exists()


def test_lm_eval_own_cli_scores_a_harness_checkpoint(mqar_checkpoint, tmp_path):
    """`python -m harness.lm_eval run --model harness ...`: lm-eval's command line, in its own
    process, finds our model by name and gives the accuracy the model's greedy tokens give."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    path, _ = mqar_checkpoint
    lm = HarnessLM(str(path))
    folder = export_task("harness_mqar", DataSources.for_checkpoint(lm.checkpoint.meta), tmp_path / "tasks")
    out_dir = tmp_path / "out"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "harness.lm_eval", "run", "--model", "harness",
         "--model_args", f"checkpoint={path},device=cpu", "--tasks", "harness_mqar", "--include_path", str(folder),
         "--limit", str(LIMIT), "--output_path", str(out_dir)],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = out_dir.rglob("results_*.json")
    acc = json.loads(results_file.read_text())["results"]["harness_mqar"]["acc,none"]
    docs = _first_docs(folder, LIMIT)
    greedy = [g for _, g in lm.score([(lm.context_tokens(d["prompt"]), lm.tokenizer.encode(" " + d["target"])) for d in docs])]
    assert acc == pytest.approx(sum(greedy) / LIMIT)
