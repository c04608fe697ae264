"""Triton kernel tests on the CPU: TRITON_INTERPRET=1 must be set before triton is imported
(kernels decorated while it is unset would compile for a GPU), so it is set here, at
collection. Run GPU tests (tests/gpu) in a separate pytest session."""

from __future__ import annotations

import contextlib
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.launch_util import CHUNK_OPS, each, fused_forward_changes  # noqa: E402
from tests.util import rel_err, row_err  # noqa: E402

pytest.importorskip("triton")


@pytest.fixture(autouse=True)
def poison_triton_buffers(monkeypatch):
    """Every buffer the Triton wrappers allocate starts as NaN: an element a kernel fails to
    write can never pass a comparison."""
    from kernels.common.triton import utils

    monkeypatch.setattr(utils.DEBUG, "poison", True)


def compare_with_reference(op, tensors: dict, initial_state, tol: float, chunk_size: int = 64, seed: int = 0):
    """Run `op` with backend="triton" and with backend="reference" on fp64 copies of the same
    inputs; check o, the final state and the gradient of every input (random output and
    final-state cotangents) by rel_err and row_err against the fp64 reference, each under tol.
    Returns the errors."""
    leaves = dict(tensors)
    if initial_state is not None:
        leaves["initial_state"] = initial_state
    ours = {name: t.detach().clone().requires_grad_(True) for name, t in leaves.items()}
    ref = {name: t.detach().double().requires_grad_(True) for name, t in leaves.items()}
    o, ht = op(**ours, output_final_state=True, backend="triton", chunk_size=chunk_size)
    o_ref, ht_ref = op(**ref, output_final_state=True, backend="reference")
    assert o.dtype == tensors["q"].dtype and o.shape == o_ref.shape
    state_dtype = torch.float64 if tensors["q"].dtype == torch.float64 else torch.float32
    assert ht.dtype == state_dtype and ht.shape == ht_ref.shape
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o.shape, generator=gen).to(o.dtype)
    dht = torch.randn(ht.shape, generator=gen).to(ht.dtype)
    grads = torch.autograd.grad((o, ht), list(ours.values()), (do, dht))
    grads_ref = torch.autograd.grad((o_ref, ht_ref), list(ref.values()), (do.double(), dht.double()))
    pairs = {"o": (o, o_ref), "final_state": (ht, ht_ref)}
    for name, grad, grad_ref, leaf in zip(ours, grads, grads_ref, ours.values()):
        assert grad.dtype == leaf.dtype and grad.shape == leaf.shape, name
        pairs["d" + name] = (grad, grad_ref)
    # Whole-tensor error, and the worst row's (one token of one head) against the typical row:
    # a wrong chunk or token among many passes the first, not the second.
    errors = {name: rel_err(a, b) for name, (a, b) in pairs.items()}
    errors.update({f"{name} (worst row)": row_err(a, b) for name, (a, b) in pairs.items()})
    bad = {name: err for name, err in errors.items() if not err < tol}
    assert not bad, f"errors over {tol:g}: {bad} (all: {errors})"
    return errors


@pytest.fixture
def compare():
    return compare_with_reference


@pytest.fixture
def bf16_dots(monkeypatch):
    """The interpreter's tl.dot multiplies bf16 tiles as their uint16 storage (it converts
    only 8-bit floats), so a bf16 product is garbage there. This widens bf16 operands to fp32
    first (exact: bf16 is fp32's top half), which is what a GPU's bf16 product computes, each
    term exact and the sums in fp32. For kernels whose bf16 products are internal (the split
    sums of kernels/common/triton/prefix.py, which the kernels take only where
    kernels.common.triton.utils.bf16_products says so: true here); the ops still refuse bf16
    inputs on the interpreter (docs/design.md §9)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    from kernels.common.triton import utils

    plain = interpreter.InterpreterBuilder.create_dot

    def widened(h):
        if h.dtype != tl.bfloat16:
            return h
        return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return plain(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    monkeypatch.setattr(utils, "bf16_products", lambda device: True)


@pytest.fixture(autouse=True)
def fused_forward_at_small_shapes():
    """The fused linear/GLA forward is used from its launch settings' min_heads sequences of
    heads on (a GPU setting); the small test shapes have a handful, so it is lowered to 1
    here and the generic tests run the fused path. The two-kernel path has tests of its own
    that switch the fused one off."""
    from kernels.common.launch import launch_settings

    with launch_settings(**each(CHUNK_OPS, fused_forward_changes(min_heads=1))):
        yield


@pytest.fixture
def launch():
    """override(**ops): launch_settings(**ops) from the call to the end of the test, on top
    of the settings in effect (calls stack, as monkeypatch's do)."""
    from kernels.common.launch import launch_settings

    with contextlib.ExitStack() as stack:
        yield lambda **ops: stack.enter_context(launch_settings(**ops))
