"""The JSONL/YAML export of our tasks (needs no lm-eval)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tasks.lm_eval_bridge.export import BRIDGE_TASKS, DataSources, answer_documents, export_task
from tasks.lm_eval_bridge.task import flatten_results, task_accuracies
from tasks.mqar import MQAR
from tasks.niah import NIAH

TINY = DataSources(mqar_config=MQAR.presets["tiny"], niah_config=NIAH.presets["tiny"], seed=5)


def _docs(folder):
    return [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]


def test_answer_documents_split_sequences_at_answers():
    inputs = np.array([[7, 1, 2, 3, 4, 5]])
    labels = np.array([[-100, 2, 3, -100, -100, 6]])
    answer_ids = np.array([[-1, 0, 0, -1, -1, 1]])
    assert list(answer_documents(inputs, labels, answer_ids)) == [(0, 0, "7 1", "2 3"), (0, 1, "7 1 2 3 4 5", "6")]
    with pytest.raises(ValueError, match="not contiguous"):
        list(answer_documents(inputs, labels, np.array([[-1, 0, -1, 0, -1, -1]])))


def test_mqar_export_is_the_task_test_data(tmp_path):
    folder = export_task("harness_mqar", TINY, tmp_path)
    docs = _docs(folder)
    setting = MQAR.Config(**MQAR.presets["tiny"]).test[0]
    assert len(docs) == setting.num_examples * setting.num_kv_pairs
    x, y = MQAR._data(MQAR.Config(**MQAR.presets["tiny"]), [setting], TINY.seed, split=1)
    doc = docs[0]
    row, length = doc["sequence"], len(doc["prompt"].split())
    assert doc["prompt"].split() == [str(t) for t in x[row, :length].tolist()]
    assert int(doc["target"]) == y[row, length - 1].item()
    spec = yaml.safe_load((folder / "harness_mqar.yaml").read_text())
    assert spec["dataset_path"] == "json" and spec["test_split"] == "test"
    assert spec["dataset_kwargs"]["data_files"]["test"] == str(folder / "test.jsonl")
    assert export_task("harness_mqar", TINY, tmp_path) == folder  # cached


def test_niah_export_targets_are_whole_values(tmp_path):
    docs = _docs(export_task("harness_niah", TINY, tmp_path))
    cfg = NIAH.Config(**NIAH.presets["tiny"])
    lengths = {v.name: v.value_len for v in cfg.variants}
    assert {d["variant"] for d in docs} == set(lengths)
    for doc in docs:
        assert len(doc["target"].split()) == lengths[doc["variant"]]
        assert len(doc["prompt"].split()) <= doc["seq_len"] and 0.0 <= doc["depth"] <= 1.0


def test_other_exports_and_unknown_task(tmp_path):
    cloze = _docs(export_task("harness_cloze", TINY, tmp_path))
    assert all(set(d) == {"kind", "context", "choices", "label"} for d in cloze)
    ppl = _docs(export_task("harness_corpus_ppl", TINY, tmp_path))
    assert 50 < len(ppl) <= TINY.max_corpus_docs and all(d["text"] for d in ppl)
    assert set(BRIDGE_TASKS) >= {"harness_mqar", "harness_mqar_gen", "harness_niah", "harness_cloze", "harness_corpus_ppl"}
    with pytest.raises(ValueError, match="ours are: harness_mqar"):
        export_task("harness_nope", TINY, tmp_path)


def test_sources_follow_the_checkpoint():
    sources = DataSources.for_checkpoint({"task": "mqar", "task_config": {"vocab_size": 64}, "seed": 2})
    assert sources.mqar_config == {"vocab_size": 64}
    assert DataSources.for_checkpoint({"task": "lm", "task_config": {"corpus": "/x", "val_fraction": 0.1}}).corpus == "/x"
    assert DataSources.for_checkpoint({}) == DataSources()


def test_flatten_results_and_task_accuracies():
    results = {"a": {"alias": "a", "acc,none": 0.5, "acc_stderr,none": 0.1, "perplexity,none": 3.0, "x_stderr,none": "N/A"},
               "g": {"exact_match,first_number": 0.25, "exact_match_stderr,first_number": 0.05}}
    flat = flatten_results(results)
    assert flat == {"a/acc": 0.5, "a/acc_stderr": 0.1, "a/perplexity": 3.0,
                    "g/exact_match_first_number": 0.25, "g/exact_match_first_number_stderr": 0.05}
    assert task_accuracies(flat, ["a", "g", "p"]) == {"a": 0.5, "g": 0.25}
    assert task_accuracies({"p/bits_per_byte": 1.0}, ["p"]) == {}


def test_lm_eval_stays_optional():
    code = ("import sys, tasks.builtin, tasks.lm_eval_bridge.task, tasks.lm_eval_bridge.export, harness.eval_cli; "
            "assert 'lm_eval' not in sys.modules, 'imported lm_eval eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True)
