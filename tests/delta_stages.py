"""Kernel-by-kernel checks of the gated delta rule's Triton pipeline (docs/design.md §10).

stage_errors runs wy_fwd, state_fwd, output_fwd, du_local, state_bwd, dqkw and wy_bwd one at
a time, as ChunkDeltaRuleFunction chains them, and holds each kernel's outputs against an
fp64 PyTorch evaluation of that kernel's formulas on the very tensors the kernel read (the
earlier kernels' outputs, not a reference's). A wrong kernel therefore shows up under its
own outputs' names only, where an end-to-end comparison sees every gradient downstream of
it go wrong at once. The interpreter tests (tests/kernels/triton/test_delta_triton.py)
check these formulas against the kernels on the CPU; tests/gpu/test_delta_stages_gpu.py
runs them on a GPU.

Each chunk of 64 tokens is a [64, ...] block of a [B, H, NT, 64, ...] tensor, the last one
zero-padded past T (gamma repeats its last real row there, as the kernels read it).
"""

from __future__ import annotations

import math

import torch

from tests.util import rel_err

CHUNK = 64
LOG2E = 1.0 / math.log(2.0)

# the outputs stage_errors checks, by kernel
STAGES = {
    "wy_fwd": ("gamma", "tm", "w", "u0"),
    "state_fwd": ("h", "u", "final_state"),
    "output_fwd": ("o",),
    "du_local": ("du_local",),
    "state_bwd": ("du", "dh", "dh0"),
    "dqkw": ("dq", "dk_part", "dw", "dgam"),
    "wy_bwd": ("dk", "dv", "dbeta", "dg"),
}
OUTPUTS = tuple(name for names in STAGES.values() for name in names)


def chunked(x: torch.Tensor, repeat_last: bool = False) -> torch.Tensor:
    """[B, T, H, *rest] -> [B, H, NT, 64, *rest] fp64, padded with zeros (or with row T - 1)."""
    B, T, H = x.shape[:3]
    NT = -(-T // CHUNK)
    idx = torch.arange(NT * CHUNK, device=x.device)
    if repeat_last:
        out = x.double()[:, idx.clamp(max=T - 1)]
    else:
        out = torch.zeros((B, NT * CHUNK) + tuple(x.shape[2:]), dtype=torch.float64, device=x.device)
        out[:, :T] = x.double()
    out = out.reshape((B, NT, CHUNK) + tuple(x.shape[2:]))
    return out.movedim(3, 1)


def unchunked(x: torch.Tensor, T: int) -> torch.Tensor:
    """The inverse of chunked: [B, H, NT, 64, *rest] -> [B, T, H, *rest]."""
    B, H, NT = x.shape[:3]
    x = x.movedim(1, 3).reshape((B, NT * CHUNK, H) + tuple(x.shape[4:]))
    return x[:, :T]


def _last(x: torch.Tensor) -> torch.Tensor:
    """Row 63 of each chunk of a chunked per-token tensor [B, H, NT, 64] -> [B, H, NT, 1]:
    the last real row, since gamma repeats it in the padding."""
    return x[..., -1:]


def _decay(gam: torch.Tensor) -> torch.Tensor:
    """Gamma_ij = 2^(gamma_i - gamma_j) where i >= j, else 0: [B, H, NT, 64, 64]."""
    diff = gam[..., :, None] - gam[..., None, :]
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=gam.device).tril()
    return torch.where(lower, torch.exp2(torch.where(lower, diff, 0.0)), 0.0)


def _strict(x: torch.Tensor) -> torch.Tensor:
    return x.tril(-1)


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2)


def _reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Sums over the last dimension from its end: [..., CHUNK] -> [..., CHUNK]."""
    return x.flip(-1).cumsum(-1).flip(-1)


def stage_errors(q, k, v, g, beta, h0, do, dht, scale: float) -> dict[str, float]:
    """rel_err of every output in OUTPUTS against its kernel's formulas evaluated in fp64 on
    that kernel's own inputs. q, k: [B, T, H, K]; v, do: [B, T, H, V]; g, beta: [B, T, H];
    h0, dht: [B, H, K, V] fp32; one dtype for q, k, v, do (as the op hands them on)."""
    from kernels.gated_delta_rule.triton_bwd import du_local, state_bwd
    from kernels.gated_delta_rule.triton_bwd_grad import dqkw
    from kernels.gated_delta_rule.triton_fwd import output_fwd, state_fwd
    from kernels.gated_delta_rule.triton_wy import wy_fwd
    from kernels.gated_delta_rule.triton_wy_bwd import wy_bwd

    T = q.shape[1]
    gam, tm, w, u0 = wy_fwd(k, v, beta, g)
    h, u, ht, _ = state_fwd(k, w, u0, gam, h0, True, None, scale)
    o = output_fwd(q, k, u, h, gam, scale)
    du = du_local(q, k, do, gam, scale)
    du_loc = du.clone()
    du, dh, dh0 = state_bwd(q, k, w, do, du, gam, dht, scale, True)
    dq, dk_part, dw, dgam_part = dqkw(q, k, u, h, dh, do, du, gam, scale)
    dk, dv, dbeta, dg = wy_bwd(k, v, beta, gam, tm, dw, du, dk_part, dgam_part, g.dtype)

    Q, Kc, Vc, dO = chunked(q), chunked(k), chunked(v), chunked(do)
    bt = chunked(beta)
    G = chunked(gam, repeat_last=True)
    Gam = _decay(G)
    eg, gc = torch.exp2(G), _last(G)
    ref: dict[str, torch.Tensor] = {}
    ours: dict[str, torch.Tensor] = {}

    # wy_fwd: gamma, Tm = (I + A)^{-1}, W = Tm diag(beta 2^gamma) K, U0 = Tm diag(beta) V
    gl = chunked(g.double().unsqueeze(-1) * LOG2E).squeeze(-1)
    ref["gamma"] = unchunked(gl.cumsum(-1), T)
    kk = Kc @ _t(Kc)
    A = _strict(bt[..., :, None] * kk * Gam)
    eye = torch.eye(CHUNK, dtype=torch.float64, device=q.device)
    ref["tm"] = unchunked(torch.linalg.inv(eye + A), T)
    Tm = chunked(tm)  # the inverse the later kernels read
    ref["w"] = unchunked(Tm @ (Kc * (bt * eg)[..., None]), T)
    ref["u0"] = unchunked(Tm @ (Vc * bt[..., None]), T)
    ours.update(gamma=gam, tm=tm, w=w, u0=u0)

    # state_fwd from the stored W and U0: U = U0 - W S_n, S_{n+1} = 2^{gamma_C} S_n + Kd^T U
    W, U0 = chunked(w), chunked(u0)
    kd = Kc * torch.exp2(gc - G)[..., None]
    S = h0.double()
    hs, us = [], []
    for n in range(W.shape[2]):
        hs.append(S)
        un = U0[:, :, n] - W[:, :, n] @ S
        us.append(un)
        S = torch.exp2(gc[:, :, n])[..., None] * S + _t(kd[:, :, n]) @ un
    ref["h"], ref["u"], ref["final_state"] = torch.stack(hs, 2), unchunked(torch.stack(us, 2), T), S
    ours.update(h=h, u=u, final_state=ht)

    # output_fwd from the stored states and U
    Hs, Uc = h.double(), chunked(u)
    P = scale * (Q @ _t(Kc)) * Gam
    ref["o"] = unchunked(scale * eg[..., None] * (Q @ Hs) + P @ Uc, T)
    ours["o"] = o

    # du_local: P^T dO
    ref["du_local"] = unchunked(_t(P) @ dO, T)
    ours["du_local"] = du_loc

    # state_bwd from the stored dU_local: dU = dU_local + Kd dS_{n+1},
    # dS_n = 2^{gamma_C} dS_{n+1} + scale (Q 2^gamma)^T dO - W^T dU
    DUl = chunked(du_loc)
    dS = dht.double()
    dhs, dus = [None] * W.shape[2], [None] * W.shape[2]
    for n in reversed(range(W.shape[2])):
        dhs[n] = dS
        dun = DUl[:, :, n] + kd[:, :, n] @ dS
        dus[n] = dun
        qg = Q[:, :, n] * (scale * eg[:, :, n])[..., None]
        dS = torch.exp2(gc[:, :, n])[..., None] * dS + _t(qg) @ dO[:, :, n] - _t(W[:, :, n]) @ dun
    ref["du"], ref["dh"], ref["dh0"] = unchunked(torch.stack(dus, 2), T), torch.stack(dhs, 2), dS
    ours.update(du=du, dh=dh, dh0=dh0)

    # dqkw from the stored states, U, dS and dU
    dHs, DU = dh.double(), chunked(du)
    dP = (dO @ _t(Uc)) * Gam
    dq_ref = scale * (eg[..., None] * (dO @ _t(Hs)) + dP @ Kc)
    ud = Uc * torch.exp2(gc - G)[..., None]
    dks = ud @ _t(dHs)
    dk_part_ref = scale * (_t(dP) @ Q) + dks
    ref["dq"], ref["dk_part"] = unchunked(dq_ref, T), unchunked(dk_part_ref, T)
    ref["dw"] = unchunked(-(DU @ _t(Hs)), T)
    dgam = (Q * dq_ref).sum(-1) - (Kc * dk_part_ref).sum(-1)
    end = torch.exp2(gc.squeeze(-1)) * (Hs * dHs).sum((-1, -2)) + (Kc * dks).sum((-1, -2))
    last_row = torch.zeros_like(dgam)
    NT = W.shape[2]
    last_row[:, :, torch.arange(NT), torch.tensor([min(CHUNK, T - n * CHUNK) - 1 for n in range(NT)])] = 1.0
    # dqkw writes per K-block a d gamma per token and, apart, the share of dg that a chunk's
    # earlier rows give; "dgam" compares dqkw's whole share of dg, reverse-summed in the chunk
    nk = dgam_part.shape[0] // 2
    dgp_tok = chunked(dgam_part[:nk].sum(0).unsqueeze(-1)).squeeze(-1)
    dgp_before = chunked(dgam_part[nk:].sum(0).unsqueeze(-1)).squeeze(-1)
    ref["dgam"] = unchunked(_reverse_cumsum(dgam + last_row * end[..., None]), T)
    ours.update(dq=dq, dk_part=dk_part, dw=dw, dgam=unchunked(_reverse_cumsum(dgp_tok) + dgp_before, T))

    # wy_bwd from the stored Tm, dW, dU, dk_part and dgam partials
    dW, dKp = chunked(dw), chunked(dk_part)
    f = bt * eg
    dTm = dW @ _t(Kc * f[..., None]) + DU @ _t(Vc * bt[..., None])
    dA = _strict(-(_t(Tm) @ dTm @ _t(Tm)))
    gkk = _strict(Gam * kk)
    dM = dA * bt[..., :, None] * Gam
    tdw, tdu = _t(Tm) @ dW, _t(Tm) @ DU
    ref["dk"] = unchunked(dKp + f[..., None] * tdw + dM @ Kc + _t(dM) @ Kc, T)
    ref["dv"] = unchunked(bt[..., None] * tdu, T)
    kdw = (Kc * tdw).sum(-1)
    ref["dbeta"] = unchunked(eg * kdw + (Vc * tdu).sum(-1) + (dA * gkk).sum(-1), T)
    daa = dA * gkk * bt[..., :, None]
    dgamma = dgp_tok + f * kdw + daa.sum(-1) - daa.sum(-2)
    ref["dg"] = unchunked(_reverse_cumsum(dgamma) + dgp_before, T)
    ours.update(dk=dk, dv=dv, dbeta=dbeta, dg=dg)

    return {name: rel_err(ours[name], ref[name]) for name in OUTPUTS}
