"""The bad-input table (issue 21): every kind of bad command-line input, across every command, is
refused before anything runs: exit code 2, a message naming what was wrong and what is valid,
no traceback, and no record or other file written.

Each case runs the command in-process. `harness.runner.execute` is replaced by a function that
fails the test, so a case that gets as far as starting a run says so at once instead of training.
The last tests check that every command reading records names each unreadable file it skips."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from harness.records import RunRecord, write_record

runner = CliRunner()
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")

# A sweep file that is valid as it stands; the sweep cases below change one thing in it.
GOOD_SWEEP = """\
mixers: [linear]
presets: [tiny]
seeds: [0]
grid:
  - tasks: [mqar]
"""


@dataclass
class Bad:
    """One case: argv (placeholders {tmp}, {res}, {sweep}, {ckpt}), the words the message must
    hold, and what the case needs first (a sweep file, files on disk, environment)."""

    argv: list[str]
    words: tuple[str, ...]
    sweep: str | None = None  # YAML text written to {sweep}
    setup: Callable[[Path], None] | None = None
    env: dict[str, str | None] = field(default_factory=dict)  # None: unset
    entry: str = "harness"  # harness (the typer app) or export (tasks.lm_eval_bridge.export's argparse)


def case(case_id: str, argv: list[str], *words: str, marks=(), **kw) -> pytest.param:
    return pytest.param(Bad(argv, words, **kw), id=case_id, marks=marks)


def run(*args: str) -> list[str]:
    """`harness run` on the tiny MQAR preset (what most run cases change) into {res}."""
    base = ["run", "--results", "{res}", "--no-wandb", "--device", "cpu"]
    if "--mixer" not in args and "-m" not in args:
        base += ["--mixer", "linear"]
    if "--task" not in args and "-t" not in args:
        base += ["--task", "mqar", "--preset", "tiny"]
    return [*base, *args]


def sets(*items: str, **kw: str) -> list[str]:
    """`harness run` with --set items (and other options as keyword pairs)."""
    extra = [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", v)]
    return run(*extra, *[x for item in items for x in ("--set", item)])


def sweep(*args: str) -> list[str]:
    return ["sweep", "{sweep}", "--results", "{res}", "--no-wandb", *args]


def edit(old: str, new: str) -> str:
    """GOOD_SWEEP with `old` replaced by `new` (the replacement must happen)."""
    assert old in GOOD_SWEEP, old
    return GOOD_SWEEP.replace(old, new)


def with_block(*lines: str) -> str:
    """GOOD_SWEEP with lines added to its grid block."""
    return GOOD_SWEEP + "".join(f"    {line}\n" for line in lines)


def evaluate(*args: str) -> list[str]:
    base = ["eval", "--results", "{res}", "--no-wandb", "--device", "cpu"]
    if "--checkpoint" not in args:
        base += ["--checkpoint", "{ckpt}"]
    if "--tasks" not in args:
        base += ["--tasks", "harness_mqar"]
    return [*base, *args]


# -- setups: files a case needs on disk ------------------------------------------------------


def a_file(tmp: Path) -> None:
    (tmp / "afile").write_text("not a folder\n")


def results_file(tmp: Path) -> None:
    (tmp / "res").write_text("not a folder\n")


def good_results(tmp: Path) -> None:
    write_record(tmp / "res", make_record("good"))


def empty_folder(tmp: Path) -> None:
    (tmp / "empty").mkdir()


def empty_corpus_file(tmp: Path) -> None:
    (tmp / "empty.txt").write_text("")


def config_file(text: str) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        (tmp / "over.yaml").write_text(text)

    return write


def torn_record(tmp: Path) -> None:
    """A record cut mid-write."""
    folder = tmp / "res" / "runs" / "mqar"
    folder.mkdir(parents=True)
    (folder / "torn.json").write_text('{"schema": "harness.run/1", "run_')


def torn_record_beside(tmp: Path) -> None:
    """A torn record beside the good one of good_results."""
    (tmp / "res" / "runs" / "mqar" / "torn.json").write_text("{")


def record_without_checkpoint(tmp: Path) -> None:
    write_record(tmp / "res", make_record("nockpt"))


def torn_checkpoint_config(tmp: Path) -> None:
    (tmp / "ckpt_bad").mkdir()
    (tmp / "ckpt_bad" / "config.json").write_text("{")


def checkpoint_without_weights(tmp: Path) -> None:
    from tasks.common.checkpoint import CONFIG_FILE

    (tmp / "ckpt_bad").mkdir()
    good = Path(os.environ["BAD_INPUT_CKPT"]) / CONFIG_FILE
    (tmp / "ckpt_bad" / CONFIG_FILE).write_text(good.read_text())


def make_record(run_id: str, **over) -> RunRecord:
    base = dict(run_id=run_id, config_hash="abc", mixer="softmax", task="mqar", preset="tiny", config={},
                metrics={"accuracy": 0.5}, backend="torch", device="cpu: test", versions={"torch": "x"},
                git_commit=None, seed=0, started="2026-01-01T00:00:00+00:00",
                finished="2026-01-01T00:00:01+00:00", duration_s=1.0, status="ok")
    return RunRecord(**{**base, **over})


NO_INTERPRETER = {"TRITON_INTERPRET": None}  # the triton backend as a user without a GPU has it
INTERPRETER = {"TRITON_INTERPRET": "1"}

CASES = [
    # -- unknown names: mixer, task, preset (issue: "an unknown mixer", "--task nosuch exits 2") --
    case("run-unknown-mixer", run("--mixer", "gdnn"), "unknown mixer 'gdnn'", "valid mixers", "Did you mean 'gdn'"),
    case("run-unknown-mixer-among-good", run("--mixer", "softmax,nosuch"), "unknown mixer 'nosuch'", "valid mixers",
         "softmax"),
    case("run-empty-mixer-list", run("--mixer", " , "), "--mixer is empty", "mixer names"),
    case("run-unknown-task", run("--task", "mqr"), "unknown task 'mqr'", "valid tasks", "Did you mean 'mqar'"),
    case("run-unknown-preset", run("--task", "mqar", "--preset", "nope"), "unknown preset 'nope'", "valid presets",
         "tiny"),
    case("run-preset-of-another-task", run("--task", "mqar", "--preset", "gpu"), "unknown preset 'gpu'", "zoology"),
    case("run-task-refuses-mixer", run("--mixer", "gla", "--task", "fidelity", "--preset", "tiny"), "gla",
         "Valid mixers: lin_gdn, linear"),
    case("run-unknown-device", run("--device", "tpu"), "--device 'tpu'", "auto, cpu or cuda"),
    case("run-cuda-missing", run("--device", "cuda"), "--device cuda", "no CUDA device", "use cpu or auto",
         marks=NO_CUDA),

    # -- options the command line itself refuses (unknown, missing, mistyped) --
    case("top-unknown-command", ["nosuch"], "No such command", "nosuch"),
    case("top-unknown-option", ["--nosuch"], "No such option", "--nosuch"),
    case("list-unknown-option", ["list", "--nosuch"], "No such option", "--nosuch"),
    case("run-unknown-option", run("--nosuch", "1"), "No such option", "--nosuch"),
    case("run-mistyped-option", run("--resuls", "x"), "No such option", "--resuls", "--results"),
    case("run-missing-task", ["run", "--mixer", "linear", "--no-wandb"], "Missing option", "--task"),
    case("run-seed-not-an-int", run("--seed", "abc"), "Invalid value for '--seed'", "valid integer"),
    case("run-log-every-zero", run("--log-every", "0"), "Invalid value for '--log-every'", "greater than or equal to 1"),

    # -- seeds: numbers the runs' random generators cannot take --
    case("run-seed-negative", run("--seed", "-1"), "--seed -1", "out of range", "from 0 to 4294967295"),
    case("run-seed-too-large", run("--seed", str(2**70)), f"--seed {2**70}", "from 0 to 4294967295"),

    # -- --set paths that do not exist, malformed items --
    case("set-unknown-key", sets("nosuch=1"), "unknown key 'nosuch'", "valid keys", "optim.lr"),
    case("set-unknown-nested-key", sets("optim.lrr=1"), "unknown key 'optim.lrr'", "valid keys", "optim.lr"),
    case("set-into-a-value", sets("optim.lr.max=1"), "'optim.lr.max'", "optim.lr is a value, not a group"),
    case("set-without-equals", sets("optim.lr"), "--set expects key=value", "'optim.lr'"),
    case("set-empty-key", sets("=1"), "unknown key ''", "valid keys"),

    # -- --set values of the wrong type --
    case("set-lr-not-a-number", sets("optim.lr=fast"), "optim.lr", "valid number", "'fast'"),
    case("set-epochs-fractional", sets("optim.epochs=1.5"), "optim.epochs", "valid integer", "1.5"),
    case("set-bool-not-a-bool", sets("save_checkpoint=maybe"), "save_checkpoint", "valid boolean", "'maybe'"),
    case("set-literal-unknown", sets("optim.schedule=linear"), "optim.schedule", "'warmup_cosine'",
         "'epoch_cosine'", "'linear'"),
    case("set-list-for-a-number", sets("optim.lr=[1, 2]"), "optim.lr", "valid number", "[1, 2]"),
    case("set-mapping-for-a-list", sets("train={seq_len: 8}"), "train", "valid list"),
    case("set-cuda-graph-on-cpu", sets("optim.cuda_graph=true"), "optim.cuda_graph=true", "needs a CUDA device",
         "auto or false", marks=NO_CUDA),

    # -- --set numbers that are not finite or out of range (issue: optim.lr=.inf / 1e99999) --
    case("set-lr-inf", sets("optim.lr=.inf"), "optim.lr", "finite number", "inf"),
    case("set-lr-1e99999", sets("optim.lr=1e99999"), "optim.lr", "finite number", "1e99999"),
    case("set-lr-nan", sets("optim.lr=.nan"), "optim.lr", "finite number", "nan"),
    case("set-grad-clip-inf", sets("optim.grad_clip=.inf"), "optim.grad_clip", "finite number"),
    case("set-lr-negative", sets("optim.lr=-1"), "optim.lr", "greater than 0", "-1"),
    case("set-lr-zero", sets("optim.lr=0"), "optim.lr", "greater than 0"),
    case("set-epochs-zero", sets("optim.epochs=0"), "optim.epochs", "greater than or equal to 1"),
    case("set-batch-size-negative", sets("optim.batch_size=-4"), "optim.batch_size", "greater than or equal to 1",
         "-4"),
    case("set-epochs-1e99999", sets("optim.epochs=1e99999"), "optim.epochs", "valid integer", "1e99999"),
    case("set-d-model-too-small", sets("model.d_model=4"), "model.d_model", "greater than or equal to 8"),
    case("set-warmup-frac-one", sets("optim.warmup_frac=1"), "optim.warmup_frac", "less than 1"),
    case("set-betas-above-one", sets("optim.betas=[1.5, 0.9]"), "optim.betas", "[0, 1)"),
    case("set-vocab-too-small", sets("vocab_size=4"), "vocab_size", "greater than or equal to 8"),
    case("set-kv-pairs-over-seq-len", sets("train=[{seq_len: 8, num_kv_pairs: 8, num_examples: 4}]"), "seq_len",
         "num_kv_pairs"),
    case("set-niah-depth-above-one", sets("depths=[1.5]", task="niah", preset="tiny"), "depths", "[0, 1]", "1.5"),
    case("set-niah-no-test-lengths", sets("test_lengths=[]", task="niah", preset="tiny"), "test_lengths",
         "at least 1 item"),

    # -- mixer options (issue: an unknown option lists the valid ones; num_heads=3 with d_model 32) --
    case("mixer-unknown-option", sets("model.mixer.heads=2"), "model.mixer.heads", "valid options", "num_heads"),
    case("mixer-option-of-another-mixer", sets("model.mixer.feature_map=elu", mixer="gdn"),
         "model.mixer.feature_map", "valid options", "decay_A_range"),
    case("mixer-option-wrong-type", sets("model.mixer.num_heads=two"), "model.mixer.num_heads", "valid integer",
         "'two'"),
    case("mixer-heads-zero", sets("model.mixer.num_heads=0"), "model.mixer.num_heads", "greater than or equal to 1"),
    case("mixer-heads-not-dividing-d-model", sets("model.mixer.num_heads=3"), "num_heads=3", "d_model=32",
         "valid num_heads: 1, 2, 4, 8, 16, 32"),
    case("mixer-heads-not-dividing-per-mixer", sets("model.per_mixer.linear.num_heads=5"),
         "model.per_mixer.linear", "num_heads=5", "valid num_heads"),
    case("mixer-chunk-not-power-of-two", sets("model.mixer.chunk_size=48"), "chunk_size", "power of two", "48"),
    case("mixer-conv-size-too-big", sets("model.mixer.conv_size=17"), "conv_size", "less than or equal to 16"),
    case("mixer-value-width-fractional", sets("model.mixer.expand_v=0.3"), "expand_v=0.3", "whole number"),
    case("mixer-gla-gate-unknown", sets("model.mixer.gate=nosuch", mixer="gla"), "model.mixer.gate", "'nosuch'"),
    case("per-mixer-unknown-option", sets("model.per_mixer.linear.nosuch=1"), "model.per_mixer.linear",
         "nosuch", "valid options"),
    case("per-mixer-unknown-mixer", sets("model.per_mixer.gdnn.num_heads=2"), "model.per_mixer", "'gdnn'",
         "valid mixers", "Did you mean 'gdn'"),

    # -- backends: unknown, not usable here (issue: backend=magic, triton on a CPU, flash_attn missing) --
    case("backend-unknown", sets("model.mixer.backend=magic"), "backend='magic'", "not valid", "'auto'", "torch"),
    case("backend-triton-on-cpu", sets("model.mixer.backend=triton"), "backend='triton'", "cannot run on cpu",
         "TRITON_INTERPRET=1", env=NO_INTERPRETER, marks=NO_CUDA),
    case("backend-flash-attn-missing", sets("model.mixer.backend=flash_attn", mixer="softmax"),
         "backend='flash_attn'", "cannot run"),
    case("backend-flash-attn-for-a-linear-op", sets("model.mixer.backend=flash_attn"), "backend='flash_attn'",
         "not valid", "'reference'", "'triton'"),
    case("throughput-backend-unknown", sets("mixer.backend=magic", task="throughput", preset="tiny"),
         "mixer.backend", "backend='magic'", "'auto'"),
    case("throughput-softmax-backend-unknown", sets("softmax.backend=magic", task="throughput", preset="tiny"),
         "softmax.backend", "backend='magic'", "'auto'"),
    case("throughput-triton-bf16-interpreter",
         sets("mixer.backend=triton", "dtype=bfloat16", task="throughput", preset="tiny"), "bfloat16",
         "float16 or float32", env=INTERPRETER, marks=NO_CUDA),
    case("throughput-softmax-backends-unknown", sets("softmax_backends=[magic]", task="throughput", preset="tiny"),
         "softmax_backends", "'magic'"),
    case("fidelity-op-backend-unknown", sets("op_backend=triton", mixer="lin_gdn", task="fidelity", preset="tiny"),
         "op_backend", "'reference'", "'torch'"),

    # -- the layer tasks' sizes (issue: throughput --set mixer.num_heads=7) --
    case("throughput-heads-in-mixer", sets("mixer.num_heads=7", task="throughput", preset="tiny"), "num_heads",
         "task fields here", "--set num_heads=4"),
    case("throughput-value-width-fractional", sets("mixer.expand_v=0.3", task="throughput", preset="tiny"),
         "mixer", "expand_v=0.3", "whole number"),
    case("memory-softmax-option-unknown", sets("softmax.nosuch=1", task="memory", preset="tiny"), "softmax.nosuch",
         "valid options", "backend"),
    case("throughput-empty-seq-lens", sets("seq_lens=[]", task="throughput", preset="tiny"), "seq_lens",
         "non-empty"),
    case("throughput-zero-seq-len", sets("seq_lens=[0, 64]", task="throughput", preset="tiny"), "seq_lens",
         "lengths >= 1"),
    case("throughput-dtype-unknown", sets("dtype=float64", task="throughput", preset="tiny"), "dtype", "'float32'",
         "'bfloat16'", "'float16'"),
    case("throughput-phase-unknown", sets("phases=[sideways]", task="throughput", preset="tiny"), "phases",
         "'fwd'", "'decode'"),
    case("memory-timeout-zero", sets("point_timeout_s=0", task="memory", preset="tiny"), "point_timeout_s",
         "greater than 0"),
    case("memory-max-bytes-negative", sets("max_bytes=-1", task="memory", preset="tiny"), "max_bytes", "-1"),

    # -- paths: corpus, --config, --results (issue: a missing corpus=, --results pointing at a file) --
    case("lm-corpus-missing", sets("corpus={tmp}/nosuch", task="lm", preset="tiny"), "corpus", "nosuch",
         "a text file or a folder of .txt/.md files"),
    case("lm-corpus-empty-folder", sets("corpus={tmp}/empty", task="lm", preset="tiny"), "corpus folder",
         "holds no", ".txt", setup=empty_folder),
    case("lm-corpus-empty-file", sets("corpus={tmp}/empty.txt", task="lm", preset="tiny"), "corpus", "empty.txt",
         "holds no text", setup=empty_corpus_file),
    case("config-file-missing", run("--config", "{tmp}/nosuch.yaml"), "cannot read config file", "nosuch.yaml"),
    case("config-file-bad-yaml", run("--config", "{tmp}/over.yaml"), "over.yaml", "not valid YAML",
         setup=config_file("optim: {lr: [\n")),
    case("config-file-a-list", run("--config", "{tmp}/over.yaml"), "over.yaml", "must hold a mapping",
         setup=config_file("- 1\n")),
    case("config-file-unknown-key", run("--config", "{tmp}/over.yaml"), "unknown key 'nosuch'", "valid keys",
         setup=config_file("nosuch: 1\n")),
    case("config-file-non-finite-value", run("--config", "{tmp}/over.yaml"), "optim.lr", "finite number",
         setup=config_file("optim: {lr: .inf}\n")),
    case("config-file-duplicate-key", run("--config", "{tmp}/over.yaml"), "over.yaml", "duplicate key 'optim'",
         setup=config_file("optim: {lr: 0.1}\noptim: {epochs: 1}\n")),
    case("results-is-a-file", run(), "--results", "is a file", "give a directory", setup=results_file),
    case("results-under-a-file", run("--results", "{tmp}/afile/res"), "--results", "afile", "cannot create",
         setup=a_file),

    # -- sweep files: shape (bad YAML syntax, empty grids, unknown and duplicate keys) --
    case("sweep-file-missing", ["sweep", "{tmp}/nosuch.yaml", "--results", "{res}"], "cannot read sweep file",
         "nosuch.yaml"),
    case("sweep-file-is-a-folder", ["sweep", "{tmp}", "--results", "{res}"], "cannot read sweep file",
         "Is a directory"),
    case("sweep-bad-yaml", sweep(), "not valid YAML", sweep="grid: [\n"),
    case("sweep-tab-indent", sweep(), "not valid YAML", sweep="grid:\n\t- tasks: [mqar]\n"),
    case("sweep-empty-file", sweep(), "must hold a mapping", "'grid' list", sweep=""),
    case("sweep-a-list", sweep(), "must hold a mapping", "'grid' list", sweep="- tasks: [mqar]\n"),
    case("sweep-no-grid", sweep(), "grid: Field required", "valid keys", sweep="mixers: [linear]\n"),
    case("sweep-empty-grid", sweep(), "grid", "at least 1 item", sweep="mixers: [linear]\ngrid: []\n"),
    case("sweep-block-not-a-mapping", sweep(), "grid.0", "valid dictionary", sweep="mixers: [linear]\ngrid: [mqar]\n"),
    case("sweep-unknown-top-key", sweep(), "mixer", "Extra inputs are not permitted", "valid keys", "mixers",
         sweep=edit("mixers:", "mixer:")),
    case("sweep-unknown-block-key", sweep(), "grid.0.task", "Extra inputs are not permitted", "tasks",
         sweep=edit("- tasks:", "- task:")),
    case("sweep-duplicate-top-key", sweep(), "duplicate key 'mixers'", "line 2",
         sweep=edit("presets:", "mixers: [gdn]\npresets:")),
    case("sweep-duplicate-block-key", sweep(), "duplicate key 'tasks'",
         sweep=with_block("tasks: [niah]")),
    case("sweep-device-unknown", sweep(), "device 'tpu'", "auto, cpu or cuda", sweep="device: tpu\n" + GOOD_SWEEP),
    case("sweep-cuda-missing", sweep(), "device cuda", "no CUDA device", sweep="device: cuda\n" + GOOD_SWEEP,
         marks=NO_CUDA),

    # -- sweep files: names (issue: an unknown mixer, top level or in a block, exits 1 with a traceback) --
    case("sweep-unknown-mixer-top", sweep(), "mixers", "unknown mixer 'gdnn'", "Did you mean 'gdn'",
         "nothing was run", sweep=edit("[linear]", "[linear, gdnn]")),
    case("sweep-unknown-mixer-in-block", sweep(), "grid[0]", "unknown mixer 'nosuch'", "valid mixers",
         sweep=with_block("mixers: [nosuch]")),
    case("sweep-no-mixers", sweep(), "no mixers", "give 'mixers'", sweep=edit("mixers: [linear]\n", "")),
    case("sweep-empty-mixers-in-block", sweep(), "no mixers", sweep=with_block("mixers: []")),
    case("sweep-unknown-task", sweep(), "unknown task 'mqr'", "Did you mean 'mqar'", sweep=edit("[mqar]", "[mqr]")),
    case("sweep-empty-tasks", sweep(), "grid.0.tasks", "at least 1 item", sweep=edit("[mqar]", "[]")),
    case("sweep-unknown-preset", sweep(), "unknown preset 'tinny'", "valid presets", sweep=edit("[tiny]", "[tinny]")),
    case("sweep-unknown-preset-in-block", sweep(), "unknown preset 'gpu'", "zoology",
         sweep=with_block("presets: [gpu]")),
    case("sweep-empty-presets", sweep(), "presets", "at least 1 item", sweep=edit("[tiny]", "[]")),
    case("sweep-task-refuses-mixer", sweep(), "fidelity", "Valid mixers: lin_gdn, linear",
         sweep=edit("[mqar]", "[fidelity]").replace("[linear]", "[gla]")),

    # -- sweep files: seeds lists --
    case("sweep-seeds-not-ints", sweep(), "seeds.0", "valid integer", sweep=edit("[0]", "[a]")),
    case("sweep-seeds-fractional", sweep(), "seeds.0", "valid integer", sweep=edit("[0]", "[1.5]")),
    case("sweep-seeds-empty", sweep(), "seeds", "at least 1 item", sweep=edit("[0]", "[]")),
    case("sweep-seeds-empty-in-block", sweep(), "grid.0.seeds", "at least 1 item", sweep=with_block("seeds: []")),
    case("sweep-seed-negative", sweep(), "seeds.0", "greater than or equal to 0", "got -1", sweep=edit("[0]", "[-1]")),
    case("sweep-seed-too-large", sweep(), "seeds.0", "less than or equal to 4294967295",
         sweep=edit("[0]", f"[{2**70}]")),

    # -- sweep files: set and vary (a vary over an unknown key, empty value lists, bad values) --
    case("sweep-vary-unknown-key", sweep(), "unknown key 'optim.lrr'", "valid keys",
         sweep=with_block("vary: {optim.lrr: [1e-3]}")),
    case("sweep-vary-not-a-list", sweep(), "grid.0.vary.optim.lr", "valid list", sweep=with_block("vary: {optim.lr: 0.1}")),
    case("sweep-vary-empty-list", sweep(), "grid.0.vary.optim.lr", "at least 1 item",
         sweep=with_block("vary: {optim.lr: []}")),
    case("sweep-set-and-vary-same-key", sweep(), "grid[0]", "optim.lr is both in set", "and in vary",
         sweep=with_block("set: {optim.lr: 0.1}", "vary: {optim.lr: [0.2]}")),
    case("sweep-vary-non-finite", sweep(), "optim.lr", "finite number", sweep=with_block("vary: {optim.lr: [.inf]}")),
    case("sweep-set-unknown-key", sweep(), "unknown key 'nosuch'", "valid keys", sweep="set: {nosuch: 1}\n" + GOOD_SWEEP),
    case("sweep-set-wrong-type", sweep(), "optim.epochs", "valid integer", "'many'",
         sweep=with_block("set: {optim.epochs: many}")),
    case("sweep-set-not-a-mapping", sweep(), "set", "valid dictionary", sweep="set: [1]\n" + GOOD_SWEEP),
    case("sweep-set-1e99999", sweep(), "optim.lr", "finite number", sweep=with_block("set: {optim.lr: 1e99999}")),
    case("sweep-backend-unknown", sweep(), "backend='magic'", "'auto'", sweep=with_block("set: {model.mixer.backend: magic}")),
    case("sweep-backend-triton-on-cpu", sweep(), "backend='triton'", "cannot run on cpu", "TRITON_INTERPRET=1",
         sweep=with_block("set: {model.mixer.backend: triton}"), env=NO_INTERPRETER, marks=NO_CUDA),
    case("sweep-backend-flash-attn-missing", sweep(), "backend='flash_attn'", "cannot run",
         sweep=edit("[linear]", "[softmax]") + "    set: {model.mixer.backend: flash_attn}\n"),
    case("sweep-heads-not-dividing-d-model", sweep(), "num_heads=3", "valid num_heads",
         sweep=with_block("set: {model.mixer.num_heads: 3}")),
    case("sweep-throughput-heads-in-mixer", sweep(), "task fields here",
         sweep=edit("[mqar]", "[throughput]") + "    set: {mixer.num_heads: 7}\n"),
    case("sweep-lm-corpus-missing", sweep(), "corpus", "neither a file nor a folder",
         sweep=edit("[mqar]", "[lm]") + "    set: {corpus: /nonexistent/corpus}\n"),

    # -- sweep options (issue: sweep --mixer nosuch exits 0 and runs nothing) --
    case("sweep-only-mixer-unknown", sweep("--mixer", "nosuch"), "--mixer nosuch", "not a mixer of this sweep",
         "linear", sweep=GOOD_SWEEP),
    case("sweep-only-task-unknown", sweep("--task", "nosuch"), "--task nosuch", "not a task of this sweep", "mqar",
         sweep=GOOD_SWEEP),
    case("sweep-executor-unknown", sweep("--executor", "slurm"), "--executor 'slurm'", "inprocess, gpus or ray",
         sweep=GOOD_SWEEP),
    case("sweep-executor-gpus-without-gpu", sweep("--executor", "gpus"), "--executor gpus", "no CUDA GPU",
         "--executor inprocess", sweep=GOOD_SWEEP, marks=NO_CUDA),
    case("sweep-runs-per-gpu-zero", sweep("--runs-per-gpu", "0"), "--runs-per-gpu", "at least 1", sweep=GOOD_SWEEP),
    case("sweep-runs-per-gpu-inprocess", sweep("--runs-per-gpu", "2"), "--runs-per-gpu 2", "only with --executor gpus",
         sweep=GOOD_SWEEP),
    case("sweep-address-without-ray", sweep("--address", "ray://head:10001"), "--address", "only with --executor ray",
         sweep=GOOD_SWEEP),
    case("sweep-results-is-a-file", sweep(), "--results", "is a file", "give a directory", sweep=GOOD_SWEEP,
         setup=results_file),
    case("sweep-results-under-a-file", ["sweep", "{sweep}", "--results", "{tmp}/afile/res"], "cannot create",
         sweep=GOOD_SWEEP, setup=a_file),

    # -- eval: checkpoints and records (issue: a corrupt record names the wrong path) --
    case("eval-checkpoint-missing", evaluate("--checkpoint", "{tmp}/nosuch"), "nosuch", "does not exist",
         "checkpoint folder"),
    case("eval-record-corrupt", evaluate("--checkpoint", "{res}/runs/mqar/torn.json"), "torn.json",
         "not a readable run record", setup=torn_record),
    case("eval-record-without-checkpoint", evaluate("--checkpoint", "{res}/runs/mqar/nockpt.json"), "nockpt.json",
         "saved no checkpoint", "save_checkpoint=true", setup=record_without_checkpoint),
    case("eval-folder-without-checkpoint", evaluate("--checkpoint", "{tmp}/empty"), "empty", "holds no checkpoint",
         "config.json", setup=empty_folder),
    case("eval-checkpoint-config-corrupt", evaluate("--checkpoint", "{tmp}/ckpt_bad"), "ckpt_bad", "config.json",
         "cannot be read", setup=torn_checkpoint_config),
    case("eval-checkpoint-weights-missing", evaluate("--checkpoint", "{tmp}/ckpt_bad"), "ckpt_bad",
         "model.safetensors", "cannot be read", setup=checkpoint_without_weights),
    case("eval-limit-zero", evaluate("--limit", "0"), "--limit", ">= 1", "0"),
    case("eval-batch-size-zero", evaluate("--batch-size", "0"), "--batch-size", "greater than or equal to 1"),
    case("eval-max-length-zero", evaluate("--max-length", "0"), "--max-length", "greater than or equal to 1"),
    case("eval-num-fewshot-negative", evaluate("--num-fewshot", "-1"), "--num-fewshot", "greater than or equal to 0"),
    case("eval-tasks-empty", evaluate("--tasks", " , "), "--tasks", "at least 1 item"),
    case("eval-unknown-harness-task", evaluate("--tasks", "harness_mqarr"), "unknown task 'harness_mqarr'",
         "Did you mean 'harness_mqar'"),
    case("eval-missing-tasks-option", ["eval", "--checkpoint", "{ckpt}"], "Missing option", "--tasks"),
    case("eval-unknown-device", evaluate("--device", "tpu"), "--device 'tpu'", "auto, cpu or cuda"),
    case("eval-seed-negative", evaluate("--seed", "-1"), "--seed -1", "from 0 to 4294967295"),
    case("eval-results-is-a-file", evaluate(), "--results", "is a file", "give a directory", setup=results_file),

    # -- leaderboard (issue: a mistyped --results exits 0 and creates the folder) --
    case("leaderboard-results-missing", ["leaderboard", "--results", "{tmp}/resluts"], "--results", "resluts",
         "is not a directory"),
    case("leaderboard-results-is-a-file", ["leaderboard", "--results", "{res}"], "--results", "is not a directory",
         setup=results_file),
    case("leaderboard-unknown-option", ["leaderboard", "--result", "{res}"], "No such option", "--result"),

    # -- dashboard (issue: a mistyped --results exits 0; an unwritable --out gives a traceback) --
    case("dashboard-results-missing", ["dashboard", "--results", "{tmp}/resluts"], "--results", "resluts",
         "is not a directory"),
    case("dashboard-results-is-a-file", ["dashboard", "--results", "{res}"], "is not a directory", setup=results_file),
    case("dashboard-out-is-a-file", ["dashboard", "--results", "{res}", "--out", "{tmp}/afile"], "--out", "afile",
         "cannot write", setup=lambda t: (good_results(t), a_file(t))),
    case("dashboard-out-under-a-file", ["dashboard", "--results", "{res}", "--out", "{tmp}/afile/page"], "--out",
         "cannot write", setup=lambda t: (good_results(t), a_file(t))),
    case("dashboard-out-is-the-results", ["dashboard", "--results", "{res}", "--out", "{res}"], "--out",
         "a folder of its own", setup=good_results),
    case("dashboard-port-without-serve", ["dashboard", "--results", "{res}", "--port", "8001"], "--port needs --serve",
         setup=good_results),
    case("dashboard-port-out-of-range", ["dashboard", "--results", "{res}", "--serve", "--port", "70000"], "--port",
         "70000", "0 to 65535", setup=good_results),
    case("dashboard-threshold-zero", ["dashboard", "--results", "{res}", "--regression-threshold", "0"],
         "--regression-threshold", "must be > 0 and finite", setup=good_results),
    case("dashboard-threshold-nan", ["dashboard", "--results", "{res}", "--regression-threshold", "nan"],
         "--regression-threshold", "must be > 0 and finite", "nan", setup=good_results),
    case("dashboard-threshold-inf", ["dashboard", "--results", "{res}", "--regression-threshold", "inf"],
         "--regression-threshold", "must be > 0 and finite", "inf", setup=good_results),

    # -- compare (issue: compare X corrupt.json says "no run records under ...") --
    case("compare-base-missing", ["compare", "{tmp}/nosuch", "{res}"], "nosuch", "does not exist",
         "a results directory or a record file", setup=good_results),
    case("compare-record-corrupt", ["compare", "{res}", "{res}/runs/mqar/torn.json"], "torn.json",
         "not a readable run record", setup=lambda t: (good_results(t), torn_record_beside(t))),
    case("compare-empty-folder", ["compare", "{res}", "{tmp}/empty"], "no run records under", "empty",
         setup=lambda t: (good_results(t), empty_folder(t))),
    case("compare-threshold-not-a-number", ["compare", "{res}", "{res}", "--threshold", "lots"], "--threshold",
         "'lots'", "5% or 0.05", setup=good_results),
    case("compare-threshold-out-of-range", ["compare", "{res}", "{res}", "--threshold", "2000%"], "--threshold",
         "out of range", "5%", setup=good_results),
    case("compare-threshold-nan", ["compare", "{res}", "{res}", "--threshold", "nan"], "--threshold", "'nan'",
         setup=good_results),
    case("compare-markdown-under-a-file", ["compare", "{res}", "{res}", "--markdown", "{tmp}/afile/report.md"],
         "--markdown", "afile", "cannot write", setup=lambda t: (good_results(t), a_file(t))),
    case("compare-missing-new", ["compare", "{res}"], "Missing argument 'new'", setup=good_results),

    # -- the lm-eval bridge's own command line (python -m tasks.lm_eval_bridge.export) --
    case("export-missing-out", [], "--out", "required", entry="export"),
    case("export-unknown-task", ["--out", "{res}", "--tasks", "harness_mqarr"], "--tasks", "'harness_mqarr'",
         "harness_mqar", entry="export"),
    case("export-unknown-preset", ["--out", "{res}", "--mqar-preset", "tinny"], "--mqar-preset", "'tinny'", "tiny",
         entry="export"),
    case("export-corpus-missing", ["--out", "{res}", "--tasks", "harness_corpus_ppl", "--corpus", "{tmp}/nosuch"],
         "--corpus", "nosuch", "neither a file nor a folder", entry="export"),
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An untrained MQAR-sized checkpoint: eval's options are checked against a real one."""
    from tasks.common.checkpoint import save_checkpoint
    from tasks.common.model import MixerLM, ModelConfig
    from tasks.lm_data import IdTokenizer

    torch.manual_seed(0)
    model = MixerLM("linear", 64, ModelConfig(d_model=16, n_layers=1, mixer={"num_heads": 2})).eval()
    meta = {"task": "none", "max_length": 32}
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "checkpoint", model, IdTokenizer(64).info(), meta)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch, checkpoint):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("BAD_INPUT_CKPT", str(checkpoint))
    monkeypatch.chdir(tmp_path)

    def no_run(*args, **kwargs):
        raise AssertionError("a run started: the input was not refused before running")

    monkeypatch.setattr("harness.runner.execute", no_run)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _invoke(bad: Bad, argv: list[str], capsys) -> tuple[int, str]:
    if bad.entry == "harness":
        out = runner.invoke(app, argv)
        if out.exception is not None and not isinstance(out.exception, SystemExit):
            raise out.exception  # the test shows the traceback the user would have seen
        return out.exit_code, out.output
    from tasks.lm_eval_bridge import export

    try:
        export.main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _fill(arg: str, names: dict[str, str]) -> str:
    for name, value in names.items():
        arg = arg.replace(name, value)
    return arg


def _flat(text: str) -> str:
    """Text without whitespace: rich wraps long messages at any space (or inside a long path)."""
    return "".join(text.split())


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_exits_2_with_no_record(bad: Bad, tmp_path, monkeypatch, checkpoint, capsys):
    for key, value in bad.env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    if bad.sweep is not None:
        (tmp_path / "sweep.yaml").write_text(bad.sweep)
    if bad.setup is not None:
        bad.setup(tmp_path)
    names = {"{tmp}": str(tmp_path), "{res}": str(tmp_path / "res"), "{sweep}": str(tmp_path / "sweep.yaml"),
             "{ckpt}": str(checkpoint)}
    argv = [_fill(arg, names) for arg in bad.argv]
    before = _tree(tmp_path)
    code, output = _invoke(bad, argv, capsys)
    assert code == 2, output
    assert "Traceback" not in output, output
    for word in bad.words:
        assert _flat(word) in _flat(output), f"{word!r} not in:\n{output}"
    assert _tree(tmp_path) == before, f"files written: {sorted(_tree(tmp_path) - before)}\n{output}"


def test_the_table_holds_every_kind():
    ids = [p.id for p in CASES]
    assert len(ids) == len(set(ids)), "case ids are unique"
    assert len(ids) >= 79


# -- valid neighbours of the cases above stay valid (issue: "the ones that are valid input excepted") --


@pytest.mark.parametrize("text", [
    pytest.param(with_block("set: {model.mixer.num_heads: 4}", "vary: {optim.lr: [1e-3, 3e-3]}"), id="heads-dividing"),
    pytest.param(with_block("set: {model.mixer.backend: torch, model.per_mixer.linear.num_heads: 8}"),
                 id="backend-torch-per-mixer"),
    pytest.param(edit("[linear]", "[softmax, linear]").replace("[0]", "[0, 4294967295]"), id="two-mixers-two-seeds"),
])
def test_valid_sweeps_pass_validation(text, tmp_path):
    (tmp_path / "sweep.yaml").write_text(text)
    out = runner.invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--results", str(tmp_path / "res"), "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "Traceback" not in out.output and not (tmp_path / "res").exists()


# -- no command reading records skips a file without saying so (issue: leaderboard, dashboard, compare) --


def _results_with_a_torn_record(root: Path) -> Path:
    for i in range(2):
        write_record(root, make_record(f"good{i}", finished=f"2026-01-0{i + 1}T00:00:01+00:00"))
    torn = root / "runs" / "mqar" / "torn.json"
    torn.write_text('{"schema": "harness.run/1", "run_')
    return torn


@pytest.mark.parametrize("command", [
    pytest.param(["leaderboard", "--results", "{res}"], id="leaderboard"),
    pytest.param(["dashboard", "--results", "{res}", "--out", "{tmp}/page"], id="dashboard"),
    pytest.param(["compare", "{res}", "{res}"], id="compare"),
    pytest.param(["sweep", "{sweep}", "--results", "{res}", "--dry-run"], id="sweep"),
])
def test_an_unreadable_record_is_named_and_the_rest_read(command, tmp_path):
    res = tmp_path / "res"
    torn = _results_with_a_torn_record(res)
    (tmp_path / "sweep.yaml").write_text(GOOD_SWEEP)
    names = {"{tmp}": str(tmp_path), "{res}": str(res), "{sweep}": str(tmp_path / "sweep.yaml")}
    argv = [_fill(arg, names) for arg in command]
    out = runner.invoke(app, argv)
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if line.startswith("warning:")]
    text = _flat(out.output)
    assert _flat(f"skipped {torn}: not a readable run record") in text, out.output
    assert text.count(_flat(f"skipped {torn}")) == 1, "each file is named once"
    assert _flat("1 unreadable record file(s) skipped") in text, out.output
    assert lines, out.output


def test_eval_names_a_corrupt_record_it_was_given(tmp_path):
    """eval reads one record (the run that saved the checkpoint): a torn one is named, not skipped."""
    torn = _results_with_a_torn_record(tmp_path / "res")
    torn.with_suffix("").mkdir()  # the artifact folder exists: only the record itself is bad
    out = runner.invoke(app, ["eval", "--checkpoint", str(torn), "--tasks", "harness_mqar", "--no-wandb",
                              "--results", str(tmp_path / "out")])
    assert out.exit_code == 2, out.output
    assert _flat(str(torn)) in _flat(out.output) and "is not a readable run record" in out.output
    assert not (tmp_path / "out").exists()


def test_a_record_file_of_another_schema_is_named_too(tmp_path):
    """A JSON file under runs/ that parses but is no run record (another tool's output) is named."""
    res = tmp_path / "res"
    write_record(res, make_record("good"))
    other = res / "runs" / "mqar" / "notes.json"
    other.write_text(json.dumps({"note": "not a record"}))
    out = runner.invoke(app, ["leaderboard", "--results", str(res)])
    assert out.exit_code == 0 and _flat(f"skipped {other}") in _flat(out.output), out.output
