"""Functional sequence-mixing ops (DESIGN §3).

Layout: q, k: [B, T, H, K]; v: [B, T, H, V]; gates g in log space ([B, T, H] or
[B, T, H, K]); beta: [B, T, H] in (0, 1]. Every op returns (o, final_state) and takes
backend="auto" | "reference" | "torch" | "triton" ("flash_attn" for softmax).
Each op has a one-token `<op>_step` for decoding.

Names are imported on first use (PEP 562), so importing one op does not import the others.
"""

from importlib import import_module

from kernels.common.dispatch import BackendStatus, backend_status, resolve_backend

OPS = (
    "softmax_attention",
    "linear_attention",
    "gated_linear_attention",
    "delta_rule",
    "gated_delta_rule",
    "linearized_softmax_gdn",
    "mesa",
)

# public name -> the op folder that defines it
_WHERE = {
    **{op: op for op in OPS},
    **{f"{op}_step": op for op in OPS},
    "KVCache": "softmax_attention",
    "LinGDNState": "linearized_softmax_gdn",
    "vala_attention": "linearized_softmax_gdn",
    "MesaState": "mesa",
}

__all__ = ["OPS", "BackendStatus", "backend_status", "resolve_backend", *_WHERE]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(import_module(f"kernels.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
