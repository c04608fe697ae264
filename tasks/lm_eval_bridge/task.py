"""The harness task `lm-eval`: score a MixerLM checkpoint with lm-evaluation-harness
(`harness eval --checkpoint PATH --tasks NAMES`), one run record per evaluation.

Our own lm-eval tasks (harness_mqar, harness_niah, harness_cloze, ...: export.py) are
exported for the checkpoint (an MQAR checkpoint gets its own MQAR test data) and indexed
alone, which takes milliseconds; lm-eval's built-in tasks are indexed (10-30 s) only when
one is asked for, and need their data in the local Hugging Face cache (we run offline).

Metrics are flattened as `<task>/<metric>` (the filter named after the metric when it is
not "none", e.g. `harness_mqar_gen/exact_match_first_number`), plus `accuracy_<task>` for
each task that reports an accuracy (acc or exact_match) and `accuracy`, their mean: the
leaderboard ranks by it and shows the per-task columns."""

from __future__ import annotations

import difflib
import json
import logging
import math
from typing import Any

from pydantic import Field, field_validator

from tasks.base import RunContext, Task, TaskConfig, TaskResult
from tasks.lm_eval_bridge import LM_EVAL_MISSING, lm_eval_available
from tasks.lm_eval_bridge.export import BRIDGE_TASKS, DataSources, export_task
from tasks.registry import register_task

RESULTS_FILE = "lm_eval_results.json"
ACCURACY_METRICS = ("acc", "exact_match", "exact_match_first_number")


class LMEvalConfig(TaskConfig):
    checkpoint: str = Field(description="checkpoint folder (config.json + model.safetensors), a folder holding one, "
                            "or the run record (.json) that saved it")
    tasks: list[str] = Field(default_factory=lambda: ["harness_mqar"], min_length=1,
                             description=f"lm-eval task names: ours ({', '.join(BRIDGE_TASKS)}) or lm-eval's")
    limit: int | None = Field(None, ge=1, description="documents per task (None: all)")
    num_fewshot: int | None = Field(None, ge=0, description="few-shot examples (None: each task's default)")
    batch_size: int = Field(16, ge=1)
    max_length: int | None = Field(None, ge=1, description="context window in tokens (None: the checkpoint's training length)")
    max_gen_toks: int = Field(256, ge=1, description="generation cap unless a task sets max_gen_toks")
    bootstrap_iters: int = Field(100, ge=0, description="bootstrap resamples for stderrs of non-mean metrics (0: none)")

    @field_validator("tasks")
    @classmethod
    def _ours_exist(cls, tasks: list[str]) -> list[str]:
        # Our names are known without indexing lm-eval's tasks (10-30 s): catch typos early.
        for name in tasks:
            if name.startswith("harness_") and name not in BRIDGE_TASKS:
                close = difflib.get_close_matches(name, BRIDGE_TASKS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown task {name!r}; the harness tasks are: {', '.join(BRIDGE_TASKS)}.{hint}")
        return tasks


def flatten_results(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """lm-eval's results {task: {"acc,none": 0.5, "acc_stderr,none": ..., "alias": ...}} as
    flat {"task/acc": 0.5, "task/acc_stderr": ...}; non-numbers (e.g. "N/A") are dropped."""
    flat = {}
    for task, values in results.items():
        for key, value in values.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                continue
            metric, filter_name = key.split(",", 1)
            if filter_name != "none":
                stem, stderr = (metric[: -len("_stderr")], "_stderr") if metric.endswith("_stderr") else (metric, "")
                metric = f"{stem}_{filter_name}{stderr}"
            flat[f"{task}/{metric}"] = float(value)
    return flat


def task_accuracies(flat: dict[str, float], tasks: list[str]) -> dict[str, float]:
    """{task: its first accuracy-like metric} for the tasks that report one."""
    found = {}
    for task in tasks:
        for metric in ACCURACY_METRICS:
            if f"{task}/{metric}" in flat:
                found[task] = flat[f"{task}/{metric}"]
                break
    return found


@register_task("lm-eval")
class LMEval(Task):
    description = "score a checkpoint with lm-evaluation-harness (harness eval): our MQAR/NIAH/cloze tasks or lm-eval's"
    Config = LMEvalConfig
    setting_fields = ("tasks", "limit", "num_fewshot", "max_length")
    shown_metrics = ()
    presets = {"default": {"tasks": ["harness_mqar"]}}

    def run(self, ctx: RunContext) -> TaskResult:
        cfg: LMEvalConfig = ctx.config
        if not lm_eval_available():
            raise RuntimeError(LM_EVAL_MISSING)
        import datasets
        import lm_eval
        import lm_eval.tasks  # TaskManager needs the tasks package imported first
        from lm_eval.tasks import TaskManager

        from tasks.common.checkpoint import load_checkpoint
        from tasks.lm_eval_bridge.model import HarnessLM

        ckpt = load_checkpoint(cfg.checkpoint, ctx.device)
        if ckpt.mixer != ctx.mixer:
            raise ValueError(
                f"checkpoint {cfg.checkpoint!r} holds a {ckpt.mixer!r} model, but the run is for mixer {ctx.mixer!r}")
        lm = HarnessLM(ckpt, device=str(ctx.device), batch_size=cfg.batch_size, max_length=cfg.max_length,
                       max_gen_toks=cfg.max_gen_toks, progress=ctx.progress)
        sources = DataSources.for_checkpoint(ckpt.meta)
        ours = [t for t in cfg.tasks if t in BRIDGE_TASKS]
        folders = [str(export_task(name, sources)) for name in ours]
        builtin = [t for t in cfg.tasks if t not in BRIDGE_TASKS]
        manager = TaskManager(include_path=folders or None, include_defaults=bool(builtin))
        quiet = logging.getLogger("lm_eval")
        level, bars = quiet.level, datasets.is_progress_bar_enabled()
        quiet.setLevel(logging.WARNING)  # lm-eval logs every step at INFO
        datasets.disable_progress_bars()  # one bar per JSONL file loaded otherwise
        try:
            out = lm_eval.simple_evaluate(
                model=lm, tasks=list(cfg.tasks), num_fewshot=cfg.num_fewshot, limit=cfg.limit, task_manager=manager,
                bootstrap_iters=cfg.bootstrap_iters, log_samples=False, random_seed=ctx.seed, numpy_random_seed=ctx.seed,
                torch_random_seed=ctx.seed, fewshot_random_seed=ctx.seed,
            )
        finally:
            quiet.setLevel(level)
            if bars:
                datasets.enable_progress_bars()

        metrics = flatten_results(out["results"])
        accuracies = task_accuracies(metrics, list(cfg.tasks))
        if accuracies:  # the leaderboard ranks by `accuracy` and shows the `accuracy_*` columns
            metrics["accuracy"] = sum(accuracies.values()) / len(accuracies)
            metrics.update({f"accuracy_{task}": value for task, value in accuracies.items()})
        ctx.log(metrics, None)
        ctx.artifact_dir.mkdir(parents=True, exist_ok=True)
        fields = ("results", "groups", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config")
        kept = {k: out.get(k) for k in fields}
        (ctx.artifact_dir / RESULTS_FILE).write_text(json.dumps(kept, indent=1, default=str))
        details = {
            "checkpoint": str(ckpt.path), "checkpoint_meta": {k: v for k, v in ckpt.meta.items() if k != "task_config"},
            "tokenizer": ckpt.tokenizer, "max_length": lm.max_length, "exported": dict(zip(ours, folders)),
            "results": out["results"], "n_samples": out.get("n-samples"), "task_versions": out.get("versions"),
            "lm_eval": getattr(lm_eval, "__version__", None),
        }
        return TaskResult(metrics=metrics, backend=",".join(sorted({b for b in ckpt.model.backends() if b})) or "none",
                          details=json.loads(json.dumps(details, default=str)), artifacts=[RESULTS_FILE])
