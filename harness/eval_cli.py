"""`harness eval`: score a checkpoint with lm-evaluation-harness and write a run record.

Registered in harness/cli.py with `app.command("eval")(eval_cmd)`. The evaluation is the
task `lm-eval` (tasks/lm_eval_bridge/task.py) run through the same runner as `harness run`:
a record under <results>/runs/lm-eval/, wandb logging, a `failed` record when it raises."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from harness.records import SEED_MAX


def eval_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-c",
                                    help="checkpoint folder (config.json + model.safetensors), a folder holding "
                                    "one, or the run record (.json) that saved it"),
    tasks: str = typer.Option(..., "--tasks", help="lm-eval task names, comma-separated: harness_mqar, harness_mqar_gen, "
                              "harness_niah, harness_cloze, harness_corpus_ppl, or lm-eval's own"),
    limit: Optional[int] = typer.Option(None, "--limit", help="documents per task (default: all)"),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", help="few-shot examples (default: each task's)"),
    batch_size: int = typer.Option(16, "--batch-size", help="sequences per forward pass"),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="context window in tokens (default: the checkpoint's)"),
    device: str = typer.Option("auto", help="auto, cpu or cuda"),
    seed: int = typer.Option(0, help=f"random seed (lm-eval's few-shot sampling), 0 to {SEED_MAX}"),
    results: Path = typer.Option(Path("results"), "--results", help="results directory"),
    no_wandb: bool = typer.Option(False, "--no-wandb", help="do not log to wandb"),
) -> None:
    """Evaluate a checkpoint with lm-evaluation-harness; writes one record (task lm-eval)."""
    from harness.cli import _prepare, _print_results, _progress, console, fail  # fail() escapes rich markup
    from tasks.lm_eval_bridge import LM_EVAL_MISSING, lm_eval_available

    if not lm_eval_available():
        raise fail(LM_EVAL_MISSING)
    from pydantic import ValidationError

    from harness.config import ConfigError, check_seed, validate_mixer_options
    from harness.runner import DeviceError, RunSpec, execute, resolve_device
    from harness.tracking import Tracker
    from tasks.common.checkpoint import load_checkpoint
    from tasks.lm_eval_bridge.task import LMEval, LMEvalConfig

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if limit is not None and limit < 1:
        raise fail(f"--limit must be >= 1, got {limit}")
    try:
        check_seed(seed)
        dev = resolve_device(device)
        mixer = load_checkpoint(checkpoint, "cpu").mixer  # read once here to fail early on a bad file
        cfg = LMEvalConfig(checkpoint=str(checkpoint.resolve()), tasks=names, limit=limit, num_fewshot=num_fewshot,
                           batch_size=batch_size, max_length=max_length)
        validate_mixer_options(mixer, cfg)
        _prepare(results)
    except ValidationError as e:
        problems = (f"--{'.'.join(map(str, err['loc'])).replace('_', '-')}: {err['msg']}" for err in e.errors())
        raise fail("; ".join(problems)) from None
    except (ValueError, DeviceError, ConfigError) as e:
        raise fail(str(e)) from None

    tracker = Tracker(enabled=not no_wandb)
    with _progress() as progress:
        progress.add_task(f"lm-eval · {mixer} on {dev}: {', '.join(names)}", total=None)
        record, path = execute(RunSpec(mixer, LMEval, "default", cfg, dev, seed), results, tracker, progress)
    _print_results([(record, path)], LMEval)
    shown = {k: v for k, v in record.metrics.items() if not k.endswith("_stderr")}
    for key, value in sorted(shown.items()):
        console.print(f"  {key} = {value:.4g}")
    if record.status != "ok":
        raise fail("the evaluation failed; see the record above", code=1)
