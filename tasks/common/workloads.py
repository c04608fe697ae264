"""What the efficiency tasks time and measure: one mixer at op level or layer level, in one
phase (forward, forward+backward, one decode step), as a zero-argument callable whose
inputs are built once, outside the call.

- layer level: the whole mixer, x [B, T, d_model] -> [B, T, d_model] (projections, short
  convolutions, gates, the op, output norm and gate); forward+backward takes the gradients
  of x and every parameter.
- op level: `mixer.run_op` on q, k, v and gates that the mixer computed from a random x
  beforehand (so they have realistic values: l2-normalised keys, decays near 1); that is the
  op call plus the mixer's op-specific wrapping (e.g. the linear mixer's denominator
  column); forward+backward takes the gradients of q, k, v and the gates.
- decode: one token after a context of T tokens, from the cache (KV cache or recurrent
  state) that a prefill of T random tokens left; every timed call starts from that same
  cache, so the context length stays T.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mixers import Mixer, build_mixer

MODES = ("op", "layer")
PHASES = ("fwd", "fwdbwd", "decode")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LayerSpec:
    """The layer being measured: sizes, dtype and the mixer's own options."""

    num_heads: int
    head_dim: int
    d_model: int
    dtype: torch.dtype
    options: dict[str, Any] = field(default_factory=dict)


def build_layer(name: str, spec: LayerSpec, device: torch.device, seed: int) -> Mixer:
    """The registered mixer `name` with spec's sizes, on `device` in spec.dtype, backend resolved."""
    clash = {"num_heads", "head_dim"} & set(spec.options)
    if clash:
        raise ValueError(f"mixer options {sorted(clash)} are task fields here; set them at the top level of the config")
    torch.manual_seed(seed)
    options = {"num_heads": spec.num_heads, "head_dim": spec.head_dim, **spec.options}
    mixer = build_mixer(name, spec.d_model, options).to(device=device, dtype=spec.dtype)
    # Op-level calls use run_op directly, so resolve the backend here (a forward would too).
    mixer.resolve(torch.empty(0, device=device, dtype=spec.dtype))
    return mixer


@dataclass
class OpInputs:
    """Inputs of one op call: q, k: [B, T, H, K], v: [B, T, H, V], gates as the mixer makes them."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    gates: dict[str, torch.Tensor]

    def tensors(self) -> list[torch.Tensor]:
        return [self.q, self.k, self.v, *self.gates.values()]


def op_inputs(mixer: Mixer, B: int, T: int, requires_grad: bool = False) -> OpInputs:
    """q, k, v and gates that `mixer` computes from a random x [B, T, d_model], as leaves."""
    device, dtype = _where(mixer)
    with torch.no_grad():
        x = torch.randn(B, T, mixer.d_model, device=device, dtype=dtype)
        q, k, v = mixer._project(x)
        gates = mixer.gates(x)
    leaves = OpInputs(q.contiguous(), k.contiguous(), v.contiguous(), {n: g.contiguous() for n, g in gates.items()})
    for t in leaves.tensors():
        t.requires_grad_(requires_grad and t.is_floating_point())
    return leaves


def phase_call(run: Callable[[], torch.Tensor], wrt: list[torch.Tensor], phase: str,
               out_like: torch.Tensor) -> Callable[[], Any]:
    """A zero-argument call of run() -> o for phase "fwd" (under no_grad) or "fwdbwd" (o and
    the gradients of `wrt` for a fixed random cotangent shaped like `out_like`, o's shape)."""
    if phase == "fwd":
        def forward():
            with torch.no_grad():
                return run()
        return forward
    if phase != "fwdbwd":
        raise ValueError(f"phase_call: phase must be 'fwd' or 'fwdbwd', got {phase!r}")
    grad_o = torch.randn_like(out_like)

    def forward_backward():
        return torch.autograd.grad(run(), wrt, grad_o, allow_unused=True)

    return forward_backward


def make_call(mixer: Mixer, mode: str, phase: str, B: int, T: int) -> Callable[[], Any]:
    """A zero-argument callable running one (mode, phase) call of `mixer` at batch B, length T."""
    if mode not in MODES or phase not in PHASES:
        raise ValueError(f"make_call: mode must be one of {MODES} and phase one of {PHASES}, got {mode!r}, {phase!r}")
    if B < 1 or T < 1:
        raise ValueError(f"make_call: need B >= 1 and T >= 1, got B={B}, T={T}")
    build = {
        ("layer", "fwd"): _layer_fwd, ("layer", "fwdbwd"): _layer_fwdbwd, ("layer", "decode"): _layer_decode,
        ("op", "fwd"): _op_fwd, ("op", "fwdbwd"): _op_fwdbwd, ("op", "decode"): _op_decode,
    }[(mode, phase)]
    return build(mixer, B, T)


def _where(mixer: Mixer) -> tuple[torch.device, torch.dtype]:
    p = next(mixer.parameters())
    return p.device, p.dtype


def _layer_fwd(mixer, B, T):
    device, dtype = _where(mixer)
    x = torch.randn(B, T, mixer.d_model, device=device, dtype=dtype)

    def call():
        with torch.no_grad():
            return mixer(x)

    return call


def _layer_fwdbwd(mixer, B, T):
    device, dtype = _where(mixer)
    x = torch.randn(B, T, mixer.d_model, device=device, dtype=dtype, requires_grad=True)
    grad_out = torch.randn(B, T, mixer.d_model, device=device, dtype=dtype)
    wrt = [x, *(p for p in mixer.parameters() if p.requires_grad)]

    def call():
        return torch.autograd.grad(mixer(x), wrt, grad_out, allow_unused=True)

    return call


def _layer_decode(mixer, B, T):
    device, dtype = _where(mixer)
    with torch.no_grad():
        _, cache = mixer.prefill(torch.randn(B, T, mixer.d_model, device=device, dtype=dtype))
    x_t = torch.randn(B, mixer.d_model, device=device, dtype=dtype)

    def call():
        with torch.no_grad():
            return mixer.step(x_t, cache)

    return call


def _op_fwd(mixer, B, T):
    inputs = op_inputs(mixer, B, T)

    def call():
        with torch.no_grad():
            return mixer.run_op(inputs.q, inputs.k, inputs.v, inputs.gates)

    return call


def _op_fwdbwd(mixer, B, T):
    inputs = op_inputs(mixer, B, T, requires_grad=True)
    # Parameters used inside run_op (MesaNet's ridge lamb) get their gradient too.
    wrt = [t for t in inputs.tensors() if t.requires_grad] + [p for p in mixer.parameters() if p.requires_grad]
    grad_o = torch.randn_like(inputs.v)

    def call():
        o, _ = mixer.run_op(inputs.q, inputs.k, inputs.v, inputs.gates)
        return torch.autograd.grad(o, wrt, grad_o, allow_unused=True)

    return call


def _op_decode(mixer, B, T):
    context = op_inputs(mixer, B, T)
    token = op_inputs(mixer, B, 1)
    with torch.no_grad():
        _, state = mixer.run_op(context.q, context.k, context.v, context.gates, output_final_state=True)
    del context
    q_t, k_t, v_t = token.q[:, 0], token.k[:, 0], token.v[:, 0]
    gates_t = {n: g[:, 0] for n, g in token.gates.items()}

    def call():
        with torch.no_grad():
            return mixer.step_op(q_t, k_t, v_t, gates_t, state)

    return call
