"""The public ops under torch.compile on the CPU: no graph break on any op's reference and torch
paths, nor (under the Triton interpreter) on the Triton paths, which run as torch.library
custom ops; a whole Gated DeltaNet layer compiles with fullgraph=True and matches eager in the
forward and the backward; the value checks still refuse bad gates outside torch.compile.

torch._dynamo.explain runs the function once and reports the graphs it captured and every break."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import kernels
from kernels.common.dispatch import backend_status
from mixers import build_mixer
from tests.util import rel_err

B, T, H, K, V = 1, 70, 2, 16, 16  # 70: a partial last chunk
TRITON_HERE = backend_status("triton", "cpu").usable
needs_triton = pytest.mark.skipif(not TRITON_HERE, reason="no Triton interpreter in this session")


def _inputs(requires_grad: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    t = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": -0.1 * torch.rand(B, T, H, generator=gen),
        "g_vector": -0.1 * torch.rand(B, T, H, K, generator=gen),
        "beta": 0.05 + 0.9 * torch.rand(B, T, H, generator=gen),
        "lamb": 0.5 + torch.rand(H, K, generator=gen),
    }
    return {name: x.requires_grad_(requires_grad) for name, x in t.items()}


# case -> (op, names of its tensor arguments after q, k, v, extra keywords)
CASES = {
    "linear_attention": ("linear_attention", (), {}),
    "gla_scalar": ("gated_linear_attention", ("g",), {}),
    "gla_vector": ("gated_linear_attention", ("g_vector",), {}),
    "delta_rule": ("delta_rule", ("beta",), {}),
    "gated_delta_rule": ("gated_delta_rule", ("g", "beta"), {}),
    "linearized_softmax_gdn": ("linearized_softmax_gdn", (), {}),
    "mesa": ("mesa", ("g", "beta", "lamb"), {"cg_steps": 4}),
    "softmax_attention": ("softmax_attention", (), {}),
}


def _call(case: str, backend: str, check_values: bool, requires_grad: bool = False):
    op, names, extra = CASES[case]
    t = _inputs(requires_grad)
    args = [t["q"], t["k"], t["v"], *(t[n] for n in names)]
    return lambda: getattr(kernels, op)(*args, backend=backend, check_values=check_values,
                                        output_final_state=True, **extra)


def _breaks(fn) -> tuple[int, list[str]]:
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)()
    return ex.graph_break_count, [str(r.reason).splitlines()[0] for r in ex.break_reasons]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("check_values", [False, True])
def test_no_graph_break_on_the_pytorch_paths(case, backend, check_values):
    """check_values=True too: under torch.compile the value checks are skipped, not traced."""
    count, reasons = _breaks(_call(case, backend, check_values))
    assert count == 0, reasons


@needs_triton
@pytest.mark.parametrize("case", [c for c in CASES if c != "softmax_attention"])  # softmax has no Triton path
def test_no_graph_break_on_the_triton_paths(case):
    count, reasons = _breaks(_call(case, "triton", check_values=False, requires_grad=True))
    assert count == 0, reasons


def test_mesa_torch_backward_traces_without_autograd_ops():
    """mesa's torch backward (the implicit-function backward, kernels/mesa/chunked.py) takes
    its parameter gradients in closed form: with inputs that require grad and dynamo's default
    config, nothing breaks the graph (a nested torch.autograd.grad would)."""
    fn = _call("mesa", "torch", check_values=False, requires_grad=True)
    count, reasons = _breaks(fn)
    assert count == 0, reasons


def _layer(mixer: str, backend: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_mixer(mixer, 32, {"num_heads": 2, "backend": backend})


@pytest.mark.parametrize("mixer, backend", [("gdn", "torch"), pytest.param("gdn", "triton", marks=needs_triton),
                                            ("mesa", "torch")])
def test_a_whole_layer_compiles_with_fullgraph_and_matches_eager(mixer, backend):
    """Compiled through AOT autograd with inductor's decompositions, run eagerly (no code
    generation on the CPU). Plain aot_eager fails the torch backend's backward: the fake
    strides of aten.softplus_backward differ from the CPU kernel's when its gradient input is
    permuted (a PyTorch stride mismatch of the kind in pytorch/pytorch#120035), and a later
    aten.view then refuses the real tensor; with the decompositions softplus_backward is
    pointwise arithmetic whose strides agree."""
    layer = _layer(mixer, backend)
    x = torch.randn(2, 70, 32, generator=torch.Generator().manual_seed(1))
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))

    def forward_backward(fn):
        xi = x.clone().requires_grad_()
        y = fn(xi)
        grads = torch.autograd.grad(y, [xi, *layer.parameters()], dy)
        return y.detach(), grads

    y_eager, grads_eager = forward_backward(layer)
    torch._dynamo.reset()
    y_comp, grads_comp = forward_backward(torch.compile(layer, fullgraph=True, backend="aot_eager_decomp_partition"))
    assert rel_err(y_comp, y_eager) < 1e-5
    names = ["x", *(n for n, _ in layer.named_parameters())]
    bad = {n: e for n, a, b in zip(names, grads_comp, grads_eager) if not (e := rel_err(a, b)) < 1e-5}
    assert not bad, bad
    assert layer.backend_used == backend


def test_a_mixer_checks_its_gates_on_its_first_call_only():
    layer = _layer("gdn", "torch")
    x = torch.randn(1, 8, 32)
    wrong = {"g": torch.full((1, 8, 2), 0.5), "beta": torch.full((1, 8, 2), 0.5)}  # a wiring bug: g > 0
    layer.gates = lambda x: wrong
    with pytest.raises(ValueError, match=r"gated_delta_rule: g is a log-space decay and must be <= 0"):
        layer(x)
    assert layer.values_checked and not layer.value_checks_due()
    layer(x)  # later calls trust the parametrisation: no host read


BAD_VALUES = [  # (case, argument, value, message)
    ("gla_scalar", "g", 0.5, r"g is a log-space decay and must be <= 0 everywhere.*max\(g\) = 0.5"),
    ("gated_delta_rule", "g", float("nan"), r"g is a log-space decay and must be <= 0"),
    ("mesa", "g", 0.5, r"g is a log-space decay and must be <= 0"),
    ("delta_rule", "beta", 0.0, r"beta must lie in \(0, 1\], got values in \[0.0, 0.0\]"),
    ("gated_delta_rule", "beta", 1.5, r"beta must lie in \(0, 1\], got values in \[1.5, 1.5\]"),
    ("mesa", "beta", -1.0, r"beta must lie in \(0, 1\]"),
    ("mesa", "lamb", 0.0, r"lamb must be finite and > 0 everywhere"),
]


@pytest.mark.parametrize("case, name, value, message", BAD_VALUES)
def test_value_checks_name_the_argument_and_check_values_false_skips_them(case, name, value, message):
    op, names, extra = CASES[case]
    t = _inputs()
    t[name] = torch.full_like(t[name], value)
    args = [t["q"], t["k"], t["v"], *(t[n] for n in names)]
    with pytest.raises(ValueError, match=f"{op}: {message}"):
        getattr(kernels, op)(*args, backend="torch", **extra)
    getattr(kernels, op)(*args, backend="torch", check_values=False, **extra)  # the caller vouches


FRESH_PROCESS_EXPLAIN = """
import torch, torch._dynamo
from mixers import build_mixer
torch.manual_seed(0)
layer = build_mixer("gdn", 32, {"num_heads": 2, "backend": "triton"})
ex = torch._dynamo.explain(layer)(torch.randn(1, 70, 32))
print(ex.graph_break_count, [str(r.reason)[:300] for r in ex.break_reasons])
"""


@needs_triton
def test_a_fresh_process_traces_a_triton_layer_without_a_break():
    """The first call of a process, traced: no backend lookup or lazy import may run inside
    dynamo (importlib and __import__ are graph breaks). Another test may have imported the
    Triton modules already, so this runs in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS_EXPLAIN], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].startswith("0 "), out.stdout[-2000:]
