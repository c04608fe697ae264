"""Random valid op arguments for the spec input factories (tests, benchmarks, compile checks).

Values are shaped like a mixer's at initialisation: q and k of unit norm per head (what the
delta rules need to stay contractive), log-decays near 0 (g = logsigmoid(x) / 16, a decay
near 1 a token), write strengths beta = sigmoid(x) and a ridge lamb = softplus(x) + 0.25.
q, k, v take the requested dtype; gates, ridge and states are fp32 (fp64 for fp64 inputs),
as the mixers compute them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F


@dataclass
class Draw:
    """Where and how to draw: dtype of q, k, v, device, and a generator seeded on that device."""

    dtype: torch.dtype
    device: torch.device
    generator: torch.Generator

    @classmethod
    def make(cls, dtype: torch.dtype, device: torch.device | str, seed: int) -> Draw:
        device = torch.device(device)
        return cls(dtype, device, torch.Generator(device=device).manual_seed(seed))

    @property
    def wide(self) -> torch.dtype:
        """The dtype of gates and states: fp32, fp64 for fp64 inputs."""
        return torch.promote_types(self.dtype, torch.float32)

    def normal(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator, device=self.device, dtype=dtype or self.wide)


def qkv(draw: Draw, B: int, T: int, H: int, K: int, V: int) -> dict[str, torch.Tensor]:
    """q, k: [B, T, H, K] of unit norm per head; v: [B, T, H, V]; all in draw.dtype."""
    q = F.normalize(draw.normal(B, T, H, K), dim=-1)
    k = F.normalize(draw.normal(B, T, H, K), dim=-1)
    v = draw.normal(B, T, H, V)
    return {"q": q.to(draw.dtype), "k": k.to(draw.dtype), "v": v.to(draw.dtype)}


def log_gate(draw: Draw, B: int, T: int, H: int, K: int, kind: Literal["scalar", "vector"]) -> torch.Tensor:
    """g: [B, T, H] (scalar) or [B, T, H, K] (vector), log-decays in (-inf, 0)."""
    shape = (B, T, H) if kind == "scalar" else (B, T, H, K)
    return F.logsigmoid(draw.normal(*shape)) / 16


def write_strength(draw: Draw, B: int, T: int, H: int) -> torch.Tensor:
    """beta: [B, T, H] in (0, 1)."""
    return torch.sigmoid(draw.normal(B, T, H))


def ridge(draw: Draw, H: int, K: int) -> torch.Tensor:
    """lamb: [H, K] >= 0.25."""
    return F.softplus(draw.normal(H, K)) + 0.25


def matrix_state(draw: Draw, B: int, H: int, K: int, V: int) -> torch.Tensor:
    """A [B, H, K, V] state of small entries (as after a few hundred decayed tokens)."""
    return 0.1 * draw.normal(B, H, K, V)


# (draw, B, T, H, K, V, variant) -> the op's tensors beyond q, k, v; (draw, B, H, K, V) -> a state.
Extras = Callable[[Draw, int, int, int, int, int, str], dict[str, Any]]
StateMaker = Callable[[Draw, int, int, int, int], Any]


def factory(extras: Extras | None = None, initial_state: StateMaker | None = None) -> Callable[..., dict[str, Any]]:
    """An op's input factory: q, k, v (qkv), the op's own tensors (`extras`) and, when asked,
    an initial state (`initial_state`).

    The factory is called as f(B, T, H, K, V, *, variant="default", dtype=torch.float32,
    device="cpu", seed=0, state=False) and returns the op's keyword arguments; the same seed
    gives the same tensors."""

    def make(B: int, T: int, H: int, K: int, V: int, *, variant: str = "default",
             dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", seed: int = 0,
             state: bool = False) -> dict[str, Any]:
        draw = Draw.make(dtype, device, seed)
        args: dict[str, Any] = qkv(draw, B, T, H, K, V)
        if extras is not None:
            args.update(extras(draw, B, T, H, K, V, variant))
        if state:
            if initial_state is None:
                raise ValueError("this op takes no initial state; call its input factory with state=False")
            args["initial_state"] = initial_state(draw, B, H, K, V)
        return args

    return make
