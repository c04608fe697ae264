"""Two implementation choices of the MQAR training step, weighed side by side on one GPU:
the causal depthwise convolutions as nn.Conv1d kernels or as shift-and-add (the form
mixers.base.causal_depthwise_conv runs), and the chunkwise delta rules' unit
lower-triangular solve as torch.linalg.solve_triangular (the form
kernels.gated_delta_rule.chunked.solve_unit_lower runs) or as an explicit inverse by block
doubling (`unit_lower_inverse` below). Both pairs compute the same function; the record says what each
costs in a compiled, graphed step of the zoology model and, for the solve, how far each is
from an fp64 reference under TF32 matmuls.

    python -m benchmarks.mqar_step_variants --out results/findings/mqar_step_variants_h200.json \
        [--mixers gdn,mesa,softmax] [--explain-mixers gdn,mesa] [--d-model 128] [--rounds 7]
    python -m benchmarks.mqar_step_variants --cpu-default --mixers gdn,... --out F.json   # eager, CPU

Every variant's model is compiled (tasks.common.training.compiled_loss) and captured
(GraphedSteps) with its functions patched in, then all variants replay in interleaved rounds:
ms per step is the median over rounds. The patches matter only while a variant is traced and
captured; a replay runs no Python.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import platform
import statistics
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.json_record import save_record
from benchmarks.mqar_step_profile import cuda_ms_per_step
from harness.config import resolve_config
from harness.envinfo import device_name
from tasks.common.graphed_step import GraphedSteps, make_capturable_adamw
from tasks.common.model import MixerLM, scored_positions
from tasks.common.timing import TimingOptions, time_callable
from tasks.common.training import compiled_loss, float32_matmul
from tasks.mqar import MQAR
from tasks.mqar_data import make_mqar

CHUNKED = importlib.import_module("kernels.gated_delta_rule.chunked")


def conv1d_causal(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The nn.Conv1d form of mixers.base.causal_depthwise_conv: x [B, T, D] -> [B, T, D]."""
    T, W = x.shape[1], weight.shape[-1]
    y = F.conv1d(x.transpose(1, 2), weight, bias, padding=W - 1, groups=x.shape[-1])[..., :T]
    return y.transpose(1, 2).contiguous()


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """(I + strictly_lower(a))^{-1} for a [..., C, C]; the diagonal and upper part of a are
    never read. C need not be a power of two (the matrix is extended by the identity)."""
    C = a.shape[-1]
    size = 1 << max(0, (C - 1).bit_length())  # the next power of two >= C
    if size != C:
        a = F.pad(a, (0, size - C, 0, size - C))  # zero coupling: the identity on the extension
    lead = a.shape[:-2]
    blocks = a.new_ones(*lead, size, 1, 1)  # the inverses of the 1 x 1 diagonal blocks
    s = 1
    while s < size:
        n = size // (2 * s)  # blocks of size 2s
        # The lower-left s x s block of each diagonal block of size 2s: [..., n, s, s].
        tiles = a.reshape(*lead, n, 2, s, n, 2, s)
        diag = torch.diagonal(tiles, dim1=-6, dim2=-3)  # [..., 2, s, 2, s, n]
        lower_left = diag[..., 1, :, 0, :, :].movedim(-1, -3)
        inv11, inv22 = blocks[..., 0::2, :, :], blocks[..., 1::2, :, :]
        inv21 = -(inv22 @ (lower_left @ inv11))
        top = torch.cat([inv11, torch.zeros_like(inv11)], dim=-1)
        bottom = torch.cat([inv21, inv22], dim=-1)
        blocks = torch.cat([top, bottom], dim=-2)  # [..., n, 2s, 2s]
        s *= 2
    inverse = blocks.squeeze(-3)
    return inverse[..., :C, :C] if size != C else inverse


def inverse_solve(a_mat: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """The explicit-inverse form of kernels.gated_delta_rule.chunked.solve_unit_lower."""
    return unit_lower_inverse(a_mat) @ rhs


@contextlib.contextmanager
def variant(conv: str, solve: str):
    """Patch in the conv ('conv1d' | 'shift') and solve ('trsm' | 'inverse') forms."""
    with contextlib.ExitStack() as stack:
        if conv == "conv1d":
            stack.enter_context(mock.patch("mixers.base.causal_depthwise_conv", conv1d_causal))
            stack.enter_context(mock.patch("tasks.common.base_conv.causal_depthwise_conv", conv1d_causal))
        if solve == "inverse":
            stack.enter_context(mock.patch.object(CHUNKED, "solve_unit_lower", inverse_solve))
        yield


def build(mixer: str, d_model: int, batch: int, seq_len: int, pairs: int, conv: str, solve: str):
    """A compiled, captured training step of the zoology model: (replay, first-step seconds)."""
    cfg = resolve_config(MQAR, "zoology", None, [f"model.d_model={d_model}", "model.mixer.backend=torch"])
    x, y = make_mqar(batch, seq_len, pairs, cfg.vocab_size, 0, cfg.power_a, cfg.random_non_queries)
    tokens, labels = torch.from_numpy(x).long().cuda(), torch.from_numpy(y).long().cuda()
    scored = int((labels != -100).sum())
    torch.manual_seed(0)
    model = MixerLM(mixer, cfg.vocab_size, cfg.model, max_positions=seq_len).cuda()
    opt = make_capturable_adamw([{"params": list(model.parameters()), "weight_decay": 0.1}], 1e-3,
                                (0.9, 0.999), torch.device("cuda"))
    steps = GraphedSteps(model, opt, None, compiled_loss(model))
    with variant(conv, solve):
        steps.step(tokens, labels, scored)  # compile, eager step, capture
    return (lambda: steps.step(tokens, labels, scored)), steps.new_shape_s


def graph_breaks(mixer: str, d_model: int, seq_len: int, pairs: int) -> dict:
    """torch._dynamo.explain of the model's loss on this GPU: graphs, breaks and their reasons."""
    cfg = resolve_config(MQAR, "zoology", None, [f"model.d_model={d_model}", "model.mixer.backend=torch"])
    x, y = make_mqar(8, seq_len, pairs, cfg.vocab_size, 0, cfg.power_a, cfg.random_non_queries)
    tokens, labels = torch.from_numpy(x).long().cuda(), torch.from_numpy(y).long().cuda()
    model = MixerLM(mixer, cfg.vocab_size, cfg.model, max_positions=seq_len).cuda()
    where = scored_positions(labels, int((labels != -100).sum()))
    torch._dynamo.reset()
    ex = torch._dynamo.explain(model.loss_at)(tokens, labels, where)
    torch._dynamo.reset()
    return {"mixer": mixer, "graphs": ex.graph_count, "breaks": ex.graph_break_count,
            "reasons": [str(r.reason).splitlines()[0][:200] for r in ex.break_reasons]}


def solve_accuracy(B: int, T: int, H: int, K: int, V: int, device: str = "cuda") -> list[dict]:
    """Max error of the chunkwise GDN output and gradients against fp64, per solve form, with
    TF32 matmuls (optim.matmul_precision=high) and fp32 ones; errors relative to the largest
    reference entry of each tensor."""
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, T, H, K, device=device, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, device=device, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, device=device, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, device=device, generator=gen) + 3.0)
    beta = torch.rand(B, T, H, device=device, generator=gen)
    up = torch.randn(B, T, H, V, device=device, generator=gen)
    inputs = [q, k, v, g, beta]

    def run(dtype, solve):
        leaves = [t.to(dtype).requires_grad_() for t in inputs]
        with variant("shift", solve):
            o, _ = CHUNKED.chunk_gated_delta_rule(*leaves, K ** -0.5)
        grads = torch.autograd.grad((o * up.to(dtype)).sum(), leaves)
        return [o.detach(), *grads]

    with float32_matmul("highest"):
        ref = run(torch.float64, "trsm")
    names = ["o", "dq", "dk", "dv", "dg", "dbeta"]
    rows = []
    for precision in ("high", "highest"):
        for solve in ("trsm", "inverse"):
            with float32_matmul(precision):
                got = run(torch.float32, solve)
            errors = {n: float((a.double() - r).abs().max() / r.abs().max()) for n, a, r in zip(names, got, ref)}
            rows.append({"matmul_precision": precision, "solve": solve, "max_rel_error": errors})
    return rows


def cpu_default_steps(mixers: list[str], rounds: int, steps: int = 10) -> list[dict]:
    """ms per eager training step (forward, backward, AdamW) of the CPU `default` preset's
    model and batch, per mixer and form, the forms interleaved in each round (a round: the
    median of `steps` steps, the tasks' one timer); median over rounds.
    The default preset has no BaseConv, so the conv form reaches ShortConv alone."""
    cfg = resolve_config(MQAR, "default", None, ["model.mixer.backend=torch"])
    setting = cfg.train[0]
    x, y = make_mqar(cfg.optim.batch_size, setting.seq_len, setting.num_kv_pairs, cfg.vocab_size, 0,
                     cfg.power_a, cfg.random_non_queries)
    tokens, labels = torch.from_numpy(x).long(), torch.from_numpy(y).long()
    rows = []
    for mixer in mixers:
        forms = [("conv1d", "trsm"), ("shift", "trsm")]
        if mixer in ("gdn", "deltanet", "lin_gdn"):
            forms.append(("shift", "inverse"))
        torch.manual_seed(0)
        model = MixerLM(mixer, cfg.vocab_size, cfg.model, max_positions=setting.seq_len)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def one_step() -> None:
            loss, _, _ = model.loss(tokens, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        times: dict[tuple[str, str], list[float]] = {f: [] for f in forms}
        per_round = TimingOptions(warmup=0, min_repeats=steps, max_repeats=steps)
        for r in range(rounds + 1):  # round 0 warms up
            for form in forms:
                with variant(*form):
                    ms = time_callable(one_step, torch.device("cpu"), per_round).median_ms
                if r:
                    times[form].append(ms)
        for (conv, solve), ts in times.items():
            rows.append({"mixer": mixer, "conv": conv, "solve": solve, "ms_per_step": statistics.median(ts),
                         "rounds_ms": ts})
            print(f"cpu {mixer} {conv}+{solve}: {rows[-1]['ms_per_step']:.2f} ms/step", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/findings/mqar_step_variants.json")
    parser.add_argument("--mixers", default="gdn,mesa,softmax")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--explain-mixers", default="gdn,mesa",
                        help="mixers whose compiled loss is checked for graph breaks on this GPU")
    parser.add_argument("--cpu-default", action="store_true",
                        help="time eager steps of the CPU default preset on this CPU instead")
    args = parser.parse_args()
    if args.cpu_default:
        record = {"what": __doc__.splitlines()[0], "device": device_name(torch.device("cpu")),
                  "threads": torch.get_num_threads(), "torch": torch.__version__,
                  "python": platform.python_version(), "numpy": np.__version__,
                  "shape": "default preset: d_model 64, batch 64, T 64 with 8 pairs, eager fp32 steps",
                  "variants": cpu_default_steps(args.mixers.split(","), args.rounds)}
        save_record(record, args.out)
        return
    batch, seq_len, pairs = 256, 256, 64
    record = {"what": __doc__.splitlines()[0], "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "python": platform.python_version(), "numpy": np.__version__,
              "shape": f"zoology model, d_model {args.d_model}, batch {batch}, T {seq_len} with {pairs} pairs, "
                       "compiled loss, TF32 matmuls, graphed step",
              "graph_breaks": [], "solve_accuracy": None, "variants": []}
    for mixer in args.explain_mixers.split(","):
        record["graph_breaks"].append(graph_breaks(mixer, args.d_model, seq_len, pairs))
        print("graph breaks:", record["graph_breaks"][-1], flush=True)
    record["solve_accuracy"] = solve_accuracy(64, 256, 2, 64, 128)
    save_record(record, args.out)
    print("solve accuracy:", record["solve_accuracy"], flush=True)
    built = []
    with float32_matmul("high"):
        for mixer in args.mixers.split(","):
            forms = [("conv1d", "trsm"), ("shift", "trsm"), ("shift", "inverse")]
            if mixer not in ("gdn", "deltanet", "lin_gdn"):
                forms = [("conv1d", "trsm"), ("shift", "trsm")]  # no triangular solve in these
            for conv, solve in forms:
                replay, first_s = build(mixer, args.d_model, batch, seq_len, pairs, conv, solve)
                for _ in range(5):
                    replay()
                built.append(({"mixer": mixer, "conv": conv, "solve": solve, "first_step_s": first_s}, replay, []))
                print(f"built {mixer} {conv}+{solve}: first step {first_s:.1f} s", flush=True)
        for _ in range(args.rounds):
            for _, replay, times in built:
                times.append(cuda_ms_per_step(replay, 20))
    for info, _, times in built:
        record["variants"].append({**info, "ms_per_step": statistics.median(times), "rounds_ms": times})
    save_record(record, args.out)
    for row in record["variants"]:
        print(f"{row['mixer']} {row['conv']}+{row['solve']}: {row['ms_per_step']:.2f} ms/step", flush=True)


if __name__ == "__main__":
    main()
