"""`harness`: an lm-eval model around a MixerLM checkpoint of any mixer.

Importing this module imports lm_eval and registers the model, so lm-eval can build it by
name (`simple_evaluate(model="harness", model_args={"checkpoint": PATH})`); the harness
itself passes an instance. Text becomes tokens through the checkpoint's tokenizer: bytes
(with BOS before every context) for `lm` checkpoints, space-separated ids for MQAR/NIAH.

- loglikelihood: full forward passes over context + continuation (right-padded batches,
  exact for causal models), summing log-softmax at the continuation's positions.
- loglikelihood_rolling: lm-eval's disjoint rolling windows of max_length tokens, the
  first conditioned on the tokenizer's prefix token (BOS for bytes).
- generate_until: greedy, prefill then one `step` per token (O(1) per token for linear
  mixers), stopping at the first `until` string, at BOS (bytes) or after max_gen_toks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from tasks.base import NullProgress, Progress
from tasks.common.checkpoint import Checkpoint, load_checkpoint
from tasks.common.decoding import greedy_decode
from tasks.lm_data import tokenizer_from_info

DEFAULT_MAX_LENGTH = 2048


@register_model("harness")
class HarnessLM(LM):
    """lm-eval's LM interface over a harness checkpoint (a path or a loaded Checkpoint)."""

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> HarnessLM:
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> HarnessLM:
        """--model_args win; lm-eval's generic options (--device, --batch_size) fill only what
        they leave unset."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    def __init__(
        self,
        checkpoint: str | Path | Checkpoint,
        device: str = "cpu",
        batch_size: int | str = 16,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        max_batch_size: int | None = None,
        progress: Progress | None = None,
    ):
        super().__init__()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but there is no CUDA device here; use device=cpu or auto")
        self._device = torch.device(device)
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint, self._device)
        self.checkpoint = ckpt
        self.model = ckpt.model.to(self._device).eval()
        self.tokenizer = tokenizer_from_info(ckpt.tokenizer)
        # "auto" (lm-eval's batch-size search) is not supported: take the default then.
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16
        if max_batch_size is not None:
            self.batch_size = min(self.batch_size, int(max_batch_size))
        self.max_length = int(max_length or ckpt.meta.get("max_length") or DEFAULT_MAX_LENGTH)
        self.max_gen_toks = int(max_gen_toks)
        if self.batch_size < 1 or self.max_length < 1:
            raise ValueError(f"batch_size and max_length must be >= 1, got {self.batch_size} and {self.max_length}")
        self.progress = progress or NullProgress()

    # -- text <-> tokens ------------------------------------------------------------------
    def context_tokens(self, context: str) -> list[int]:
        """A context as tokens: BOS first where the tokenizer has one, the prefix token if empty."""
        tok = self.tokenizer
        ids = ([tok.bos_id] if tok.add_bos else []) + tok.encode(context)
        return ids or [tok.prefix_id]

    # -- lm-eval's three requests ---------------------------------------------------------
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = [(self.context_tokens(ctx), self.tokenizer.encode(cont)) for ctx, cont in (r.args for r in requests)]
        results = self.score(pairs, "loglikelihood")
        for request, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests) -> list[float]:
        windows, owner = [], []
        for i, request in enumerate(requests):
            tokens = self.tokenizer.encode(request.args[0])
            rolling = lm_utils.get_rolling_token_windows(
                token_list=tokens, prefix_token=self.tokenizer.prefix_id, max_seq_len=self.max_length, context_len=1)
            for window in map(lm_utils.make_disjoint_window, rolling):
                windows.append(window)
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self.score(windows, "loglikelihood_rolling")):
            totals[i] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests) -> list[str]:
        jobs = []
        for context, gen_kwargs in (r.args for r in requests):
            kwargs = dict(gen_kwargs or {})
            if kwargs.get("do_sample") and kwargs.get("temperature", 1.0) > 0:
                raise ValueError(f"the harness model decodes greedily only; got do_sample=True in {gen_kwargs}")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            limit = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            jobs.append((self.context_tokens(context)[-self.max_length :], until, limit))
        outputs = [""] * len(jobs)
        bar = self.progress.add_task("lm-eval generate_until", total=len(jobs))
        # Batch prompts of equal length, so no padding enters a recurrent state.
        order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][0]))
        groups: list[list[int]] = []
        for i in order:
            if groups and len(groups[-1]) < self.batch_size and len(jobs[groups[-1][0]][0]) == len(jobs[i][0]):
                groups[-1].append(i)
            else:
                groups.append([i])
        for group in groups:
            for i, text in zip(group, self._generate([jobs[i] for i in group])):
                outputs[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
            self.progress.advance(bar, len(group))
        self.progress.remove_task(bar)
        return outputs

    # -- the work -------------------------------------------------------------------------
    def _generate(self, jobs: list[tuple[list[int], list[str], int]]) -> list[str]:
        """Greedy continuations of equal-length prompts, each cut at its first stop string."""
        tok = self.tokenizer

        def should_stop(row: int, generated: list[int]) -> bool:
            _, until, limit = jobs[row]
            if len(generated) >= limit or (tok.bos_id is not None and generated[-1] == tok.bos_id):
                return True
            text = tok.decode(generated)
            return any(u in text for u in until)

        prompt = torch.tensor([job[0] for job in jobs], device=self._device)
        generated = greedy_decode(self.model, prompt, max(job[2] for job in jobs), should_stop)
        texts = []
        for (_, until, limit), ids in zip(jobs, generated):
            ids = ids[:limit]
            if tok.bos_id is not None and tok.bos_id in ids:
                ids = ids[: ids.index(tok.bos_id)]
            text = tok.decode(ids)
            cut = min((text.index(u) for u in until if u and u in text), default=len(text))
            texts.append(text[:cut])
        return texts

    @torch.no_grad()
    def score(self, pairs: list[tuple[list[int], list[int]]], label: str = "score") -> list[tuple[float, bool]]:
        """(sum of log-probabilities of the continuation, whether it is the greedy one) per
        (context tokens (>= 1), continuation tokens) pair; inputs longer than max_length keep
        their last max_length tokens."""
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        rows = []
        for i, (context, continuation) in enumerate(pairs):
            if not continuation:
                continue
            if not context:
                raise ValueError(f"request {i}: an empty context has no token to condition on")
            if len(continuation) > self.max_length:
                raise ValueError(f"request {i}: continuation of {len(continuation)} tokens exceeds max_length={self.max_length}")
            tokens = (context + continuation)[-(self.max_length + 1) :]
            rows.append((i, tokens[:-1], continuation))
        rows.sort(key=lambda r: -len(r[1]))
        bar = self.progress.add_task(f"lm-eval {label}", total=len(rows))
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            width = len(batch[0][1])
            inputs = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.bool)
            targets = []
            for b, (_, tokens, continuation) in enumerate(batch):
                inputs[b, : len(tokens)] = torch.tensor(tokens)
                mask[b, len(tokens) - len(continuation) : len(tokens)] = True
                targets += continuation
            # Right padding never reaches earlier positions of a causal model.
            logprobs = self.model(inputs.to(self._device), mask.to(self._device)).float().log_softmax(-1)
            targets_t = torch.tensor(targets, device=self._device)
            picked = logprobs.gather(-1, targets_t[:, None])[:, 0]
            greedy = logprobs.argmax(-1) == targets_t
            offset = 0
            for i, _, continuation in batch:
                n = len(continuation)
                results[i] = (float(picked[offset : offset + n].sum()), bool(greedy[offset : offset + n].all()))
                offset += n
            self.progress.advance(bar, len(batch))
        self.progress.remove_task(bar)
        return results

    def get_model_info(self) -> dict[str, Any]:
        """Shown in lm-eval's results["config"]."""
        return {"mixer": self.checkpoint.mixer, "checkpoint": str(self.checkpoint.path), "tokenizer": self.checkpoint.tokenizer,
                "parameters": self.model.num_parameters(), "max_length": self.max_length}
