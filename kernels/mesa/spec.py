"""The OpSpec of MesaNet (kernels.common.spec)."""

from __future__ import annotations

from typing import Any

import torch

from kernels.common import counts, inputs
from kernels.common.checks import check_beta, check_gate, check_qkv, default_scale
from kernels.common.spec import Backend, Counts, FlaKernel, OpSpec
from kernels.mesa.checks import check_lamb, check_mesa_state, check_options
from kernels.mesa.chunked import mesa_chunked
from kernels.mesa.reference import mesa_reference
from kernels.mesa.state import MesaState


def validate(op: str, args: dict[str, Any], check_values: bool) -> dict[str, Any]:
    """q, k, v, g (<= 0), beta (in (0, 1]) and lamb (finite, > 0) with check_values, the
    MesaState, scale, the CG options, and g, beta, lamb on q's device."""
    q = args["q"]
    B, T, H, K, V = check_qkv(op, q, args["k"], args["v"])
    check_gate(op, args["g"], B, T, H, K, allow_vector=False, device=q.device, check_values=check_values)
    check_beta(op, args["beta"], B, T, H, device=q.device, check_values=check_values)
    check_lamb(op, "lamb", args["lamb"], H, K, check_values=check_values)
    args["initial_state"] = check_mesa_state(op, "initial_state", args["initial_state"], B, H, K, V)
    args["scale"] = default_scale(op, args["scale"], K)
    check_options(op, args["chunk_size"], args["cg_steps"], args["cg_tol"])
    for name in ("g", "beta", "lamb"):
        if args[name].device != q.device:
            raise ValueError(f"{op}: {name} is on {args[name].device} but q is on {q.device}")
    return args


def chunked_cg(**args: Any):
    """The torch backend: chunks and CG (mesa_chunked)."""
    if args["cg_tol"] is not None and torch.compiler.is_compiling():
        # CG with a tolerance stops on a device read (cg.py), which dynamo cannot trace:
        # this call runs eagerly, one graph break
        return torch.compiler.disable(mesa_chunked)(**args)
    return mesa_chunked(**args)


def forward_flops(B: int, T: int, H: int, K: int, V: int, chunk_size: int = 64, cg_steps: int = 0,
                  **_: Any) -> float:
    return counts.chunked(lambda c: counts.mesa_chunk(c, K, V, cg_steps), B, T, H, chunk_size)


def decode_flops(B: int, H: int, K: int, V: int, context: int) -> float:
    # H_kk, H_kv: decay and rank-1 update (3K^2 + 3KV); exact solve by LU (2K^3/3) and
    # two triangular solves (2K^2); o = H_kv^T q* (2KV).
    return float(B * H * (5 * K * K + 5 * K * V + 2 * K**3 / 3))


def gates(draw: inputs.Draw, B: int, T: int, H: int, K: int, V: int, variant: str) -> dict[str, Any]:
    return {"g": inputs.log_gate(draw, B, T, H, K, "scalar"), "beta": inputs.write_strength(draw, B, T, H),
            "lamb": inputs.ridge(draw, H, K)}


def moments(draw: inputs.Draw, B: int, H: int, K: int, V: int) -> MesaState:
    """h_kk = a a^T (symmetric PSD) and a small h_kv."""
    a = 0.3 * draw.normal(B, H, K, K)
    return MesaState(a @ a.transpose(-1, -2), inputs.matrix_state(draw, B, H, K, V))


def fla_call(kernel, a: dict[str, Any]) -> torch.Tensor:
    steps = int(a.get("cg_steps", 30))
    return kernel(a["q"], a["k"], a["v"], a["g"], a["beta"], a["lamb"], max_CG_iteration=steps)[0]


SPEC = OpSpec(
    name="mesa",
    function="kernels.mesa:mesa",
    step="kernels.mesa:mesa_step",
    state="MesaState(h_kk [B, H, K, K], h_kv [B, H, K, V]) (fp32; fp64 for fp64 inputs)",
    backends={
        "reference": Backend(mesa_reference, ignores=("chunk_size", "cg_steps", "cg_tol")),
        "torch": Backend(chunked_cg),
        "triton": Backend("kernels.mesa.triton_op:mesa_triton"),
    },
    validate=validate,
    counts=Counts(forward_flops, counts.FWDBWD_CHUNKED, decode_flops),
    inputs=inputs.factory(gates, initial_state=moments),
    fla={"default": FlaKernel("chunk_mesa_net", "fla.ops:mesa_net.chunk_mesa_net", fla_call, ("cg_steps", "lamb"))},
)
