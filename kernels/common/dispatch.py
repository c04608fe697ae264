"""Backend selection for every op: one place decides which implementation runs.

`resolve_backend` turns a requested backend ("auto" or a concrete name) into the
concrete backend that will run for tensors on a given device, or raises a
ValueError that says why the request cannot run here. Ops call it first and
mixers record what it returned, so the backend in a run record is the one that ran.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

# The backends of an op that has no OpSpec; each registered op lists its own in its spec.
DEFAULT_BACKENDS = ("reference", "torch", "triton")
# Every backend name any op has (the CLI's table of what runs here).
ALL_BACKENDS = ("reference", "torch", "triton", "fa4", "fa3", "flash_attn")
# Softmax attention's FlashAttention backends, fastest first: "auto" tries them in this order.
FLASH_BACKENDS = ("fa4", "fa3", "flash_attn")


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run on a device here, and if not, why not."""

    name: str
    usable: bool
    reason: str


def triton_interpret() -> bool:
    """True when Triton kernels run on the CPU through the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Whether a package is importable, looked up once per process: torch.compile refuses to trace
# importlib (a graph break), and a dict read traces as a constant.
_PRESENT: dict[str, bool] = {}
# flash_attn: FlashAttention-2 (its flash_attn_func lives in the package's __init__);
# flash_attn_interface: FlashAttention-3 (the hopper/ build); flash_attn.cute: FlashAttention-4,
# whose CuTe DSL imports as cutlass (package nvidia-cutlass-dsl).
OPTIONAL_PACKAGES = ("triton", "flash_attn", "flash_attn_interface", "flash_attn.cute", "cutlass", "fla")
# Packages that count only as regular packages: FlashAttention-4's wheel installs flash_attn/cute
# without flash_attn/__init__.py, so flash_attn alone is then a bare namespace without FA2 in it.
_REGULAR_ONLY = ("flash_attn",)


def _find(name: str) -> bool:
    """Whether module `name` can be imported, found without importing anything: find_spec on a
    dotted name imports its parent (flash_attn's __init__ loads the FA2 CUDA extension), so a
    submodule is looked for as a folder or .py file in its parent package's search path."""
    top, *subs = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    if not subs:
        return name not in _REGULAR_ONLY or spec.origin not in (None, "namespace")
    locations = list(spec.submodule_search_locations or [])
    for i, sub in enumerate(subs):
        if i == len(subs) - 1 and any(os.path.isfile(os.path.join(loc, sub + ".py")) for loc in locations):
            return True
        locations = [os.path.join(loc, sub) for loc in locations if os.path.isdir(os.path.join(loc, sub))]
        if not locations:
            return False
    return True


def _has_module(name: str) -> bool:
    if name not in _PRESENT:
        try:
            _PRESENT[name] = _find(name)
        except (ImportError, ValueError):
            _PRESENT[name] = False
    return _PRESENT[name]


for _name in OPTIONAL_PACKAGES:
    _has_module(_name)

# (major, minor) compute capability per CUDA device, read once: the FlashAttention backends ask
# on every resolution, inside compiled models too.
_CAPABILITY: dict[str, tuple[int, int]] = {}


def device_capability(device: torch.device | str) -> tuple[int, int] | None:
    """The CUDA compute capability (major, minor) of `device`, or None when it is not a CUDA
    device of this process. The FlashAttention backends' one device check: tests replace it to
    run those backends' dispatch on the CPU."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    key = str(dev)
    if key not in _CAPABILITY:
        _CAPABILITY[key] = tuple(torch.cuda.get_device_capability(dev))
    return _CAPABILITY[key]


# backend -> (its name in messages, how to install it, the oldest architecture it runs on).
# FA4's source has an sm80 path too; on Ampere FA2 is the tuned kernel, so fa4 starts at Hopper.
_FLASH = {
    "fa4": ("FlashAttention-4 (flash_attn.cute)", "pip install flash-attn-4", (9, 0)),
    "fa3": ("FlashAttention-3 (flash_attn_interface)", "build flash-attention's hopper/ folder", (9, 0)),
    "flash_attn": ("FlashAttention-2 (flash_attn)", "pip install flash-attn", (8, 0)),
}


def _flash_status(backend: str, dev: torch.device) -> BackendStatus:
    """Package, then device, then architecture: the first thing missing is the reason."""
    label, install, oldest = _FLASH[backend]
    if backend == "fa4":
        if not _has_module("flash_attn.cute"):
            return BackendStatus(backend, False, f"{label} is not installed ({install})")
        if not _has_module("cutlass"):
            return BackendStatus(backend, False, f"{label} is present but its CuTe DSL is not "
                                                 "(package nvidia-cutlass-dsl, imported as cutlass)")
    elif not _has_module("flash_attn_interface" if backend == "fa3" else "flash_attn"):
        return BackendStatus(backend, False, f"{label} is not installed ({install})")
    capability = device_capability(dev)
    if capability is None:
        return BackendStatus(backend, False, f"{label} needs a CUDA device, got {dev.type}")
    if backend != "flash_attn" and torch.version.hip is not None:
        return BackendStatus(backend, False, f"{label} needs an NVIDIA GPU; this torch is a ROCm build")
    if capability < oldest:
        arch = "sm{}{}".format(*capability)
        return BackendStatus(backend, False, f"{label} needs sm{oldest[0]}{oldest[1]} or newer, got {arch}")
    return BackendStatus(backend, True, "{} installed, sm{}{} CUDA device".format(label, *capability))


def backend_status(backend: str, device: torch.device | str) -> BackendStatus:
    """Say whether `backend` can run for tensors on `device`, and why not."""
    dev = torch.device(device)
    if backend in ("reference", "torch"):
        return BackendStatus(backend, True, "plain PyTorch, any device")
    if backend == "triton":
        if not _has_module("triton"):
            return BackendStatus(backend, False, "package triton is not installed")
        if dev.type == "cuda":
            return BackendStatus(backend, True, "CUDA device")
        if triton_interpret():
            return BackendStatus(backend, True, "CPU through TRITON_INTERPRET=1 (slow, for tests)")
        return BackendStatus(
            backend, False, "no CUDA device (set TRITON_INTERPRET=1 to run it on the CPU interpreter)"
        )
    if backend in FLASH_BACKENDS:
        return _flash_status(backend, dev)
    if backend == "fla":
        if not _has_module("fla"):
            return BackendStatus(backend, False, "package fla (flash-linear-attention) is not installed")
        if dev.type != "cuda":
            return BackendStatus(backend, False, "fla needs a CUDA device")
        return BackendStatus(backend, True, "fla installed, CUDA device (comparison only)")
    return BackendStatus(backend, False, f"unknown backend {backend!r}")


def auto_kernel(device: torch.device | str, dtype: torch.dtype | None = None) -> str:
    """"auto" for the ops with a Triton backend: triton on CUDA where it runs, else torch."""
    dev = torch.device(device)
    return "triton" if dev.type == "cuda" and backend_status("triton", dev).usable else "torch"


def choose_backend(
    op: str, valid: tuple[str, ...], auto, requested: str, device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> str:
    """The concrete backend among `valid` that runs `op` for tensors on `device`.

    `requested` is "auto", answered by auto(device, dtype), or one of `valid`. Raises
    ValueError naming the op, the request and what is valid here."""
    if requested == "auto":
        return auto(device, dtype)
    if requested not in valid:
        raise ValueError(
            f"{op}: backend={requested!r} is not valid; expected 'auto' or one of {list(valid)}"
        )
    status = backend_status(requested, device)
    if not status.usable:
        raise ValueError(f"{op}: backend={requested!r} cannot run on {torch.device(device)}: {status.reason}")
    if requested == "triton" and torch.device(device).type == "cpu" and dtype == torch.bfloat16:
        # The interpreter multiplies bf16 tiles wrongly (numpy has no bf16): refuse, never return garbage.
        raise ValueError(f"{op}: backend='triton' under TRITON_INTERPRET=1 cannot take bfloat16 inputs (the "
                         "interpreter has no bf16 dot products); use float16 or float32, or backend='torch'")
    return requested


def resolve_backend(
    op: str, requested: str, device: torch.device | str, dtype: torch.dtype | None = None
) -> str:
    """Return the concrete backend that runs `op` for tensors on `device`.

    `requested` is "auto" or one of the op's backends (its OpSpec in kernels.registry). "auto"
    picks triton on CUDA and torch elsewhere (softmax: the fastest FlashAttention that runs
    for fp16/bf16 inputs, else torch/SDPA; kernels/softmax_attention/spec.py). An op that is not
    registered (a third-party mixer's own op) has the backends reference, torch and triton.
    Raises ValueError naming the op, the request and what is valid here.
    """
    from kernels.registry import SPECS  # lazy: the registry imports every op, which import this module

    spec = SPECS.get(op)
    if spec is not None:
        return spec.resolve(requested, device, dtype)
    return choose_backend(op, DEFAULT_BACKENDS, auto_kernel, requested, device, dtype)


STEP_BACKENDS = ("reference", "torch", "triton")


def resolve_step_backend(op: str, requested: str, tensors: list[torch.Tensor | None]) -> str:
    """"torch" or "triton" for a one-token decode step of a linear op.

    `tensors`: the step's inputs and state (None entries ignored; the first is q_t). "auto"
    picks the fused Triton step (kernels/common/triton/step.py) on CUDA for fp16/bf16/fp32
    inputs when no gradient is being recorded, since that kernel has no backward; else the
    PyTorch step. "reference" is the PyTorch step (a step is the recurrence itself).
    Raises ValueError when "triton" is asked for where it cannot run."""
    if requested not in ("auto", *STEP_BACKENDS):
        raise ValueError(f"{op}: backend={requested!r} is not valid; expected 'auto' or one of {list(STEP_BACKENDS)}")
    present = [t for t in tensors if t is not None]
    q_t = present[0]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in present)
    if requested == "auto":
        fast = q_t.device.type == "cuda" and q_t.dtype != torch.float64 and not needs_grad
        return "triton" if fast and backend_status("triton", q_t.device).usable else "torch"
    if requested != "triton":
        return "torch"
    status = backend_status("triton", q_t.device)
    if not status.usable:
        raise ValueError(f"{op}: backend='triton' cannot run on {q_t.device}: {status.reason}")
    if q_t.dtype == torch.float64:
        raise ValueError(f"{op}: backend='triton' takes fp16, bf16 or fp32 inputs, got float64 (use backend='torch')")
    if needs_grad:
        raise ValueError(f"{op}: backend='triton' has no backward for the decode step; "
                         "use backend='torch' (or 'auto') when gradients are needed")
    return "triton"
