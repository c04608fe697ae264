"""A whole Gated DeltaNet layer (mixers/gdn.py) with backend="triton" under
torch.compile(fullgraph=True) and the default inductor backend on a CUDA GPU.

dynamo captures the layer as one graph with no break, the Triton gated delta rule inside it as
its custom op (kernels/gated_delta_rule/triton_op.py); the compiled forward and backward (the
output, the input gradient and every parameter gradient) match eager within the dtype's
tolerance. Inductor fuses the layer's pointwise work and rounds a fused chain once where
eager rounds every step (in bf16, to 8 bits), so the bounds sit above tests/util.py's TOL; the
Triton kernels are the same launches on both sides.

Skipped without CUDA, and in a session where TRITON_INTERPRET is set (run tests/gpu in a
pytest session of its own). Errors are printed (-s) and, when GPU_ERRORS_JSON names a file,
written there.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from mixers import build_mixer
from tests.util import GPU_ONLY, TOL, record_gpu_errors, rel_err

pytestmark = GPU_ONLY

pytest.importorskip("triton")

D_MODEL, HEADS = 512, 4  # head_dim 128
B, T = 2, 1000  # 1000: a partial last chunk
# compiled against eager, whole tensor: fp32 10x TOL; bf16 3x TOL, each fused chain rounded
# once to 8 bits against once per step
COMPILE_TOL = {torch.float32: 10 * TOL[torch.float32], torch.bfloat16: 3 * TOL[torch.bfloat16]}


def _layer(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_mixer("gdn", D_MODEL, {"num_heads": HEADS, "backend": "triton"}).to("cuda", dtype)


def _forward_backward(fn, layer, x, dy):
    xi = x.clone().requires_grad_()
    y = fn(xi)
    grads = torch.autograd.grad(y, [xi, *layer.parameters()], dy)
    names = ["x", *(n for n, _ in layer.named_parameters())]
    return y.detach(), dict(zip(names, grads))


def test_the_layer_is_one_graph_holding_the_triton_custom_op():
    layer = _layer(torch.bfloat16)
    x = torch.randn(B, T, D_MODEL, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    ex = torch._dynamo.explain(layer)(x)
    assert ex.graph_break_count == 0, [str(r.reason) for r in ex.break_reasons]
    assert ex.graph_count == 1
    assert "mixer_harness.delta_rule_fwd" in ex.graphs[0].code
    assert layer.backend_used == "triton"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fullgraph_inductor_forward_and_backward_match_eager(dtype):
    layer = _layer(dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(B, T, D_MODEL, device="cuda", dtype=dtype, generator=gen)
    dy = torch.randn(B, T, D_MODEL, device="cuda", dtype=dtype, generator=gen)
    y_eager, grads_eager = _forward_backward(layer, layer, x, dy)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    y_comp, grads_comp = _forward_backward(compiled, layer, x, dy)
    errors = {"y": rel_err(y_comp, y_eager)}
    errors.update({f"d{name}": rel_err(grads_comp[name], grads_eager[name]) for name in grads_eager})
    record_gpu_errors(f"compile_gdn_{str(dtype).removeprefix('torch.')}", errors)
    tol = COMPILE_TOL[dtype]
    bad = {name: err for name, err in errors.items() if not err < tol}
    assert not bad, f"errors over {tol:g}: {bad}"
