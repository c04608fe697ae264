"""Our tasks as lm-eval tasks: JSONL documents plus a task YAML each (`dataset_path: json`),
so lm-eval scores any model on them offline.

Tasks (one folder each, holding `<task>.yaml` and `test.jsonl`):
- harness_mqar: one document per MQAR query; prompt = the sequence up to and including the
  query key, target = its value; loglikelihood, `acc` = the value is the greedy prediction
  (for a model trained on ids this is exactly the MQAR task's accuracy on the same data).
- harness_mqar_gen: the same documents, scored by generating (exact match of the first
  number generated).
- harness_niah: one document per NIAH answer (all value tokens must be greedy: RULER's exact
  match, teacher-forced as in the niah task).
- harness_cloze: 4-way multiple choice over the tiny corpus's facts (tasks/lm_corpus.py).
- harness_corpus_ppl: loglikelihood_rolling over a corpus's validation paragraphs.

Token sequences are rendered as space-separated ids ("12 7 301"), which a model trained on
ids reads back exactly (IdTokenizer) and any text model reads as text. Documents are
shuffled (fixed seed) so `--limit N` samples every setting.

Run an exported task with any lm-eval model:
    python -m tasks.lm_eval_bridge.export --out DIR
    lm_eval --model hf --model_args pretrained=NAME --include_path DIR --tasks harness_mqar
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

EXPORT_VERSION = 1  # part of every export's cache key: bump it when documents or YAML bodies change


@dataclass(frozen=True)
class DataSources:
    """What the exported documents are generated from: task configs (JSON dicts), a seed, a corpus."""

    mqar_config: dict[str, Any] = field(default_factory=dict)  # MQARConfig fields; {} = the "default" preset
    niah_config: dict[str, Any] = field(default_factory=dict)  # NIAHConfig fields; {} = the "default" preset
    seed: int = 0
    corpus: str | None = None  # None: the shipped tiny corpus
    val_fraction: float = 0.05
    max_corpus_docs: int = 500

    @classmethod
    def for_checkpoint(cls, meta: dict[str, Any]) -> "DataSources":
        """The data a checkpoint was trained for: its own MQAR/NIAH config and seed, or its corpus."""
        task, config, seed = meta.get("task"), meta.get("task_config") or {}, int(meta.get("seed", 0))
        if task == "mqar":
            return cls(mqar_config=config, seed=seed)
        if task == "niah":
            return cls(niah_config=config, seed=seed)
        if task == "lm":
            return cls(corpus=config.get("corpus"), val_fraction=config.get("val_fraction", 0.05))
        return cls()


def _mqar_config(sources: DataSources):
    from tasks.mqar import MQAR, MQARConfig

    return MQARConfig(**(sources.mqar_config or MQAR.presets["default"]))


def _niah_config(sources: DataSources):
    from tasks.niah import NIAH, NIAHConfig

    return NIAHConfig(**(sources.niah_config or NIAH.presets["default"]))


def ids_text(tokens: np.ndarray) -> str:
    return " ".join(str(int(t)) for t in tokens)


def answer_documents(inputs: np.ndarray, labels: np.ndarray, answer_ids: np.ndarray) -> Iterator[tuple[int, int, str, str]]:
    """(row, answer, prompt, target) per answer; an answer's label positions must be contiguous.

    inputs, labels, answer_ids: [N, T] (labels = next tokens, -100 unscored; answer_ids -1 unscored)."""
    for row in range(inputs.shape[0]):
        for answer in np.unique(answer_ids[row][answer_ids[row] >= 0]):
            pos = np.flatnonzero(answer_ids[row] == answer)
            if pos[-1] - pos[0] + 1 != len(pos):
                raise ValueError(f"answer {answer} of row {row} is not contiguous (positions {pos.tolist()})")
            yield row, int(answer), ids_text(inputs[row, : pos[0] + 1]), ids_text(labels[row, pos])


def _mqar_docs(sources: DataSources) -> list[dict]:
    from tasks.mqar import MQAR

    cfg = _mqar_config(sources)
    docs = []
    for setting in cfg.test:
        # The MQAR task's own test data for this seed (split 1), so accuracies agree.
        x, y = (t.numpy() for t in MQAR._data(cfg, [setting], sources.seed, split=1))
        scored = y != -100
        answer_ids = np.where(scored, np.cumsum(scored, axis=1) - 1, -1)
        for row, answer, prompt, target in answer_documents(x, y, answer_ids):
            docs.append({"prompt": prompt, "target": target, "seq_len": setting.seq_len,
                         "num_kv_pairs": setting.num_kv_pairs, "sequence": row, "query": answer})
    return docs


def _niah_docs(sources: DataSources) -> list[dict]:
    from tasks.niah import NIAH

    cfg = _niah_config(sources)
    docs = []
    for length in cfg.test_lengths:
        for variant in cfg.variants:
            block = NIAH._test_block(cfg, variant, length, sources.seed)
            for row, answer, prompt, target in answer_documents(block.inputs, block.labels, block.answer_ids):
                docs.append({"prompt": prompt, "target": target, "variant": variant.name, "seq_len": length,
                             "depth": float(block.answer_depths[row, answer]), "sequence": row, "answer": answer})
    return docs


def _cloze_docs(sources: DataSources) -> list[dict]:
    from tasks.lm_corpus import cloze_items

    return cloze_items()


def _corpus_docs(sources: DataSources) -> list[dict]:
    from tasks.lm_data import load_documents, split_documents

    _, val = split_documents(load_documents(sources.corpus), sources.val_fraction)
    return [{"text": doc} for doc in val[: sources.max_corpus_docs]]


def _metric(name: str, aggregation: str, higher_is_better: bool) -> dict[str, Any]:
    return {"metric": name, "aggregation": aggregation, "higher_is_better": higher_is_better}


_LOGLIKELIHOOD = {"output_type": "loglikelihood", "doc_to_text": "prompt", "doc_to_target": "target",
                  "metric_list": [_metric("acc", "mean", True), _metric("perplexity", "perplexity", False)]}
_TASKS: dict[str, tuple[Callable[[DataSources], list[dict]], dict[str, Any], tuple[str, ...]]] = {
    # name: (documents, YAML body, the DataSources fields the documents depend on)
    "harness_mqar": (_mqar_docs, _LOGLIKELIHOOD, ("mqar_config", "seed")),
    "harness_mqar_gen": (_mqar_docs, {
        "output_type": "generate_until", "doc_to_text": "prompt", "doc_to_target": "target",
        # Models trained on ids never stop by themselves: score the first number generated.
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
        "filter_list": [{"name": "first_number", "filter": [
            {"function": "regex", "regex_pattern": r"(\d+)", "group_select": 0}, {"function": "take_first"}]}],
        "metric_list": [_metric("exact_match", "mean", True)],
    }, ("mqar_config", "seed")),
    "harness_niah": (_niah_docs, _LOGLIKELIHOOD, ("niah_config", "seed")),
    "harness_cloze": (_cloze_docs, {
        "output_type": "multiple_choice", "doc_to_text": "context", "doc_to_choice": "choices", "doc_to_target": "label",
        "metric_list": [_metric("acc", "mean", True), _metric("acc_norm", "mean", True)],
    }, ()),
    "harness_corpus_ppl": (_corpus_docs, {
        "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "text",
        "metric_list": [_metric("word_perplexity", "weighted_perplexity", False),
                        _metric("byte_perplexity", "weighted_perplexity", False),
                        _metric("bits_per_byte", "bits_per_byte", False)],
    }, ("corpus", "val_fraction", "max_corpus_docs")),
}
BRIDGE_TASKS = tuple(_TASKS)


def default_export_root() -> Path:
    from tasks.common.datacache import cache_root

    return cache_root() / "lm_eval"


def task_spec(name: str, sources: DataSources) -> dict[str, Any]:
    """Everything the task's files depend on (their cache key)."""
    if name not in _TASKS:
        raise ValueError(f"unknown harness lm-eval task {name!r}; ours are: {', '.join(BRIDGE_TASKS)}")
    picked = {k: v for k, v in asdict(sources).items() if k in _TASKS[name][2]}
    return {"v": EXPORT_VERSION, "task": name, **picked}


def task_yaml(name: str, data_file: Path) -> dict[str, Any]:
    """The lm-eval task config of `name` reading its documents from data_file (absolute path)."""
    body = _TASKS[name][1]
    return {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data_file)}},
            "test_split": "test", **body, "metadata": {"version": float(EXPORT_VERSION)}}


def export_task(name: str, sources: DataSources, root: str | Path | None = None) -> Path:
    """Write (once) the folder of task `name`: <root>/<name>/<spec hash>/{<name>.yaml, test.jsonl}; returns it."""
    spec = task_spec(name, sources)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = Path(root or default_export_root()).resolve() / name / key
    if (folder / f"{name}.yaml").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    docs = _TASKS[name][0](sources)
    random.Random(sources.seed).shuffle(docs)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        with open(tmp / "test.jsonl", "w") as f:
            f.writelines(json.dumps(doc) + "\n" for doc in docs)
        (tmp / "spec.json").write_text(json.dumps(spec, indent=1, sort_keys=True, default=str))
        # The YAML names the final location, valid once the folder is renamed into place.
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump(task_yaml(name, folder / "test.jsonl"), sort_keys=False))
        try:
            os.rename(tmp, folder)
        except OSError:  # another process exported the same spec first: use theirs
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> None:
    """Export our tasks for lm-eval's own command line (defaults: the MQAR/NIAH default presets)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write the tasks into (pass it as --include_path)")
    parser.add_argument("--tasks", default=",".join(BRIDGE_TASKS), help="comma-separated, from: " + ", ".join(BRIDGE_TASKS))
    parser.add_argument("--mqar-preset", default="default", help="MQAR preset whose test settings are exported")
    parser.add_argument("--niah-preset", default="default", help="NIAH preset whose test settings are exported")
    parser.add_argument("--corpus", default=None, help="corpus for harness_corpus_ppl (default: the tiny corpus)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from tasks.lm_data import corpus_files
    from tasks.mqar import MQAR
    from tasks.niah import NIAH

    # Every option is checked before the first task is written: a refused command leaves no folder.
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not names:
        parser.error(f"argument --tasks: give one or more of {', '.join(BRIDGE_TASKS)}")
    for name in names:
        if name not in BRIDGE_TASKS:
            close = difflib.get_close_matches(name, BRIDGE_TASKS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            parser.error(f"argument --tasks: unknown task {name!r}; ours are: {', '.join(BRIDGE_TASKS)}.{hint}")
    for option, task in (("--mqar-preset", MQAR), ("--niah-preset", NIAH)):
        preset = getattr(args, option[2:].replace("-", "_"))
        if preset not in task.presets:
            parser.error(f"argument {option}: unknown preset {preset!r}; valid presets: {', '.join(task.presets)}")
    if args.corpus is not None:
        try:
            corpus_files(args.corpus)
        except ValueError as e:
            parser.error(f"argument --corpus: {e}")

    sources = DataSources(mqar_config=MQAR.presets[args.mqar_preset], niah_config=NIAH.presets[args.niah_preset],
                          seed=args.seed, corpus=args.corpus)
    for name in names:
        print(export_task(name, sources, args.out))


if __name__ == "__main__":
    main()
