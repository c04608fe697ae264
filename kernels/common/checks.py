"""Argument checks shared by every op: each failure is a ValueError that names the
argument, what was received and what is valid.

Shape, dtype and device checks read only metadata and always run. Value checks (g <= 0,
beta in (0, 1], mesa's lamb > 0) reduce the tensor and read the result on the host: a device
sync, and a graph break under torch.compile. They run when the op is called with
check_values=True and the host may read the device (`reads_values`)."""

from __future__ import annotations

from typing import Any, Literal

import torch

from kernels.common.chunking import check_chunk_size

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def graph_capturing(t: torch.Tensor) -> bool:
    """True while a graph is being captured around t: torch.compile tracing it (dynamo), or
    t's CUDA stream being captured into a CUDA graph.

    Reading t's values on the host is a graph break under torch.compile and a forbidden host
    sync under CUDA-graph capture. While capturing, ops skip their value checks (the graphed
    training step checks its loss instead) and code that branches on a device value takes
    the branch that is right for every value."""
    if torch.compiler.is_compiling():
        return True
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def reads_values(t: torch.Tensor, check_values: bool) -> bool:
    """Whether a value check of t runs: asked for (an op's check_values) and possible (not
    while a graph is captured, see graph_capturing)."""
    return bool(check_values) and not graph_capturing(t)


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_qkv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Check q, k: [B, T, H, K] and v: [B, T, H, V]; return (B, T, H, K, V)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{op}: {name} must have 4 dimensions [B, T, H, D], got shape {_shape(t)}"
            )
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{op}: {name} has dtype {t.dtype}; valid: float16, bfloat16, float32, float64")
    if q.shape != k.shape:
        raise ValueError(f"{op}: q and k must have the same shape [B, T, H, K], got q {_shape(q)} and k {_shape(k)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"{op}: v must be [B, T, H, V] with B, T, H as in q {_shape(q)}, got v {_shape(v)}"
        )
    if min(q.shape) == 0 or v.shape[-1] == 0:
        raise ValueError(f"{op}: every dimension must be at least 1 (B, T, H, K, V), got q {_shape(q)} and v {_shape(v)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{op}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"{op}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, T, H, K = q.shape
    return B, T, H, K, v.shape[-1]


def _float_on(op: str, name: str, t: torch.Tensor, device: torch.device | None) -> None:
    """t holds floats and (when device is given) lives on the inputs' device."""
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{op}: {name} has dtype {t.dtype}; valid: float16, bfloat16, float32, float64")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but q, k, v are on {device}; put them on one device")


def check_gate(op: str, g: torch.Tensor, B: int, T: int, H: int, K: int, allow_vector: bool,
               device: torch.device | None = None, check_values: bool = True) -> bool:
    """Check a log-space gate g of shape [B, T, H] (or [B, T, H, K] when allowed), floating,
    on `device` when given, and (see reads_values) g <= 0 everywhere. Returns True for a
    vector gate."""
    def valid() -> str:  # formatted only on an error: formatting sizes pins them under torch.compile
        return f"[{B}, {T}, {H}]" + (f" or [{B}, {T}, {H}, {K}]" if allow_vector else "")

    if not isinstance(g, torch.Tensor):
        raise ValueError(f"{op}: g must be a torch.Tensor of shape {valid()}, got {type(g).__name__}")
    _float_on(op, "g", g, device)
    if tuple(g.shape) == (B, T, H):
        vector = False
    elif allow_vector and tuple(g.shape) == (B, T, H, K):
        vector = True
    else:
        raise ValueError(f"{op}: g must have shape {valid()}, got {_shape(g)}")
    if not reads_values(g, check_values):
        return vector
    with torch.no_grad():
        gmax = g.max().item()
        if not (gmax <= 0.0):  # catches NaN too
            raise ValueError(
                f"{op}: g is a log-space decay and must be <= 0 everywhere (decay = exp(g) in (0, 1]); "
                f"got max(g) = {gmax}"
            )
    return vector


def check_beta(op: str, beta: torch.Tensor, B: int, T: int, H: int, device: torch.device | None = None,
               check_values: bool = True) -> None:
    """Check beta: [B, T, H], floating, on `device` when given, and (see reads_values) its
    values in (0, 1]."""
    if not isinstance(beta, torch.Tensor) or tuple(beta.shape) != (B, T, H):
        got = _shape(beta) if isinstance(beta, torch.Tensor) else type(beta).__name__
        raise ValueError(f"{op}: beta must have shape [{B}, {T}, {H}], got {got}")
    _float_on(op, "beta", beta, device)
    if not reads_values(beta, check_values):
        return
    with torch.no_grad():
        bmin, bmax = beta.min().item(), beta.max().item()
    if not (bmin > 0.0 and bmax <= 1.0):
        raise ValueError(f"{op}: beta must lie in (0, 1], got values in [{bmin}, {bmax}]")


def check_state(op: str, name: str, state: torch.Tensor | None, shape: tuple[int, ...],
                device: torch.device | None = None) -> None:
    """Check an optional state tensor: its expected shape, floating, on `device` when given."""
    if state is None:
        return
    if not isinstance(state, torch.Tensor) or tuple(state.shape) != tuple(shape):
        got = _shape(state) if isinstance(state, torch.Tensor) else type(state).__name__
        raise ValueError(f"{op}: {name} must have shape [{', '.join(map(str, shape))}], got {got}")
    _float_on(op, name, state, device)


def default_scale(op: str, scale: float | None, K: int) -> float:
    """The query scale: K ** -0.5 unless given; must be a finite positive number."""
    if scale is None:
        return K**-0.5
    s = float(scale)
    if not (s > 0.0 and s < float("inf")):
        raise ValueError(f"{op}: scale must be a finite positive number, got {scale}")
    return s


# -- one-token (decode step) arguments ------------------------------------------------------


def check_step_qkv(op: str, q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor) -> tuple[int, int, int, int]:
    """Check one token's q_t, k_t: [B, H, K] and v_t: [B, H, V]; return (B, H, K, V)."""
    for name, t in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{op}: {name} must have 3 dimensions [B, H, D] (one token), got shape {_shape(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{op}: {name} has dtype {t.dtype}; valid: float16, bfloat16, float32, float64")
    if q_t.shape != k_t.shape:
        raise ValueError(f"{op}: q_t and k_t must have the same shape [B, H, K], got {_shape(q_t)} and {_shape(k_t)}")
    if v_t.shape[:2] != q_t.shape[:2]:
        raise ValueError(f"{op}: v_t must be [B, H, V] with B, H as in q_t {_shape(q_t)}, got {_shape(v_t)}")
    B, H, K = q_t.shape
    return B, H, K, v_t.shape[-1]


def check_step_gate(op: str, g_t: torch.Tensor, B: int, H: int, K: int | None = None) -> None:
    """Check one token's log-gate g_t: [B, H] (or [B, H, K] when K is given), and its values
    <= 0 unless a graph is being captured (graph_capturing)."""
    shapes = [(B, H)] + ([(B, H, K)] if K is not None else [])
    if not isinstance(g_t, torch.Tensor) or tuple(g_t.shape) not in shapes:
        got = _shape(g_t) if isinstance(g_t, torch.Tensor) else type(g_t).__name__
        valid = " or ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
        raise ValueError(f"{op}: g_t must have shape {valid}, got {got}")
    if graph_capturing(g_t):
        return
    with torch.no_grad():
        gmax = g_t.max().item()
    if not gmax <= 0.0:  # catches NaN too
        raise ValueError(f"{op}: g_t is a log-space decay and must be <= 0 everywhere; got max(g_t) = {gmax}")


def check_step_beta(op: str, beta_t: torch.Tensor, B: int, H: int) -> None:
    """Check one token's beta_t: [B, H], and its values in (0, 1] unless a graph is being
    captured (graph_capturing)."""
    if not isinstance(beta_t, torch.Tensor) or tuple(beta_t.shape) != (B, H):
        got = _shape(beta_t) if isinstance(beta_t, torch.Tensor) else type(beta_t).__name__
        raise ValueError(f"{op}: beta_t must have shape [{B}, {H}], got {got}")
    if graph_capturing(beta_t):
        return
    with torch.no_grad():
        bmin, bmax = beta_t.min().item(), beta_t.max().item()
    if not (bmin > 0.0 and bmax <= 1.0):
        raise ValueError(f"{op}: beta_t must lie in (0, 1], got values in [{bmin}, {bmax}]")


def step_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a step computes and keeps its state in: fp64 for fp64 inputs, else fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def matrix_state_checks(gate: Literal["none", "scalar", "scalar_or_vector"], beta: bool):
    """The `validate` of an OpSpec (kernels.common.spec) whose state is one [B, H, K, V] matrix:
    q, k, v; the gate g (of that kind) and beta when the op takes them; initial_state; scale
    (K ** -0.5 unless given); chunk_size."""
    def validate(op: str, args: dict[str, Any], check_values: bool) -> dict[str, Any]:
        q = args["q"]
        B, T, H, K, V = check_qkv(op, q, args["k"], args["v"])
        if gate != "none":
            check_gate(op, args["g"], B, T, H, K, allow_vector=gate == "scalar_or_vector", device=q.device,
                       check_values=check_values)
        if beta:
            check_beta(op, args["beta"], B, T, H, device=q.device, check_values=check_values)
        check_state(op, "initial_state", args["initial_state"], (B, H, K, V), device=q.device)
        args["scale"] = default_scale(op, args["scale"], K)
        check_chunk_size(op, args["chunk_size"])
        return args

    return validate
