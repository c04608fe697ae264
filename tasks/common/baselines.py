"""Reference kernels timed in the same process as a mixer, as extra columns of the efficiency
tasks: softmax attention pinned to each backend (flash-attn, SDPA's flash, cuDNN,
memory-efficient and math kernels) and FLA's chunk kernels for the ops it has (named in each
op's OpSpec, kernels/<op>/spec.py).

flash_attn and fla are optional: they are imported lazily, inside functions, and a backend
that cannot run here is skipped with the reason recorded (never replaced by another one).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from kernels.common.spec import FlaKernel, load_entry
from kernels.registry import SPECS
from mixers import Mixer
from tasks.common.faults import describe
from tasks.common.workloads import op_inputs, phase_call

SOFTMAX_BACKENDS = ("flash_attn", "flash_attn_cute", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math")
_SDPA = {
    "sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_math": "MATH",
}


def _attention_fn(name: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """Causal attention on q, k, v [B, T, H, D] -> [B, T, H, D] through backend `name`."""
    if name in _SDPA:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, _SDPA[name])

        def sdpa(q, k, v):
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            return o.transpose(1, 2)

        return sdpa
    if name == "flash_attn":
        fn = importlib.import_module("flash_attn").flash_attn_func
    elif name == "flash_attn_cute":  # FlashAttention-4 (CuTe DSL build)
        fn = importlib.import_module("flash_attn.cute").flash_attn_func
    else:
        raise ValueError(f"softmax baseline {name!r} is not known; valid: {', '.join(SOFTMAX_BACKENDS)}")

    def flash(q, k, v):
        out = fn(q, k, v, causal=True)
        return out[0] if isinstance(out, tuple) else out

    return flash


def softmax_baseline_call(
    name: str, phase: str, B: int, T: int, H: int, D: int, device: torch.device, dtype: torch.dtype
) -> Callable[[], Any]:
    """A zero-argument call of causal softmax attention through backend `name` (phase fwd or fwdbwd)."""
    if phase not in ("fwd", "fwdbwd"):
        raise ValueError(f"softmax_baseline_call: phase must be 'fwd' or 'fwdbwd', got {phase!r}")
    attend = _attention_fn(name)
    q, k, v = (torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=phase == "fwdbwd") for _ in range(3))
    return phase_call(lambda: attend(q, k, v), [q, k, v], phase, q)


def softmax_backend_status(name: str, H: int, D: int, device: torch.device, dtype: torch.dtype) -> str | None:
    """None if backend `name` runs causal attention at these H, D, dtype here; else why not."""
    if name in ("flash_attn", "flash_attn_cute", "sdpa_cudnn", "sdpa_efficient") and torch.device(device).type != "cuda":
        return "needs a CUDA device (no CPU kernel)"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            softmax_baseline_call(name, "fwdbwd", 1, 128, H, D, device, dtype)()
    except ImportError as e:
        return f"not installed ({describe(e)})"
    except Exception as e:  # noqa: BLE001 - any refusal makes the backend unusable here
        # SDPA says why a pinned kernel refused in its warnings; keep the first one.
        why = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
        return describe(e) + (f" ({why[0]})" if why else "")
    return None


# -- FLA ----------------------------------------------------------------------------------

def fla_status(device: torch.device) -> str | None:
    """None if FLA's kernels can run here; else why not ('fla: not installed', no CUDA)."""
    try:
        importlib.import_module("fla.ops")
    except ImportError as e:
        return f"fla: not installed ({describe(e)})"
    if torch.device(device).type != "cuda":
        return "fla: needs a CUDA device"
    return None


def _fla_kernel(mixer: Mixer) -> FlaKernel | None:
    """FLA's kernel for the mixer's op and gates (its OpSpec's `fla`), or None when FLA has none."""
    spec = SPECS.get(mixer.op_name)
    if spec is None or not spec.fla:
        return None
    probe = op_inputs(mixer, 1, 1)  # one token shows the gates' kind (e.g. GLA's scalar or vector)
    return spec.fla_kernel(spec.variant_of({"q": probe.q, "k": probe.k, "v": probe.v, **probe.gates}))


def fla_kernel_name(mixer: Mixer) -> str | None:
    """The name of FLA's chunk kernel for the mixer's op, or None when FLA has none."""
    kernel = _fla_kernel(mixer)
    return kernel.name if kernel is not None else None


def _mixer_args(mixer: Mixer, names: tuple[str, ...]) -> dict[str, Any]:
    """What FLA's call needs beyond q, k, v and gates: config fields, or the mixer's tensors (detached)."""
    return {name: getattr(mixer.config, name) if hasattr(mixer.config, name) else getattr(mixer, name)().detach()
            for name in names}


def fla_call(mixer: Mixer, phase: str, B: int, T: int) -> Callable[[], Any]:
    """A zero-argument call of FLA's kernel for the mixer's op, on the mixer's own q, k, v and
    gates (phase fwd or fwdbwd). Raises ValueError when FLA has no such kernel."""
    if phase not in ("fwd", "fwdbwd"):
        raise ValueError(f"fla_call: phase must be 'fwd' or 'fwdbwd', got {phase!r}")
    kernel = _fla_kernel(mixer)
    if kernel is None:
        raise ValueError(f"fla has no kernel for op {mixer.op_name}")
    fn = load_entry(kernel.entry)
    inputs = op_inputs(mixer, B, T, requires_grad=phase == "fwdbwd")
    args = {"q": inputs.q, "k": inputs.k, "v": inputs.v, **inputs.gates, **_mixer_args(mixer, kernel.mixer_args)}
    return phase_call(lambda: kernel.call(fn, args), [t for t in inputs.tensors() if t.requires_grad], phase,
                      inputs.v)
