"""What the Triton backends share to run as torch.library custom ops.

Dynamo cannot trace a Triton launch. Each Triton backend's autograd.Function therefore runs
inside two custom ops, one around its forward and one around its backward, which dynamo and
AOT autograd treat as opaque nodes whose output shapes come from a fake implementation.
The forward op also returns the tensors the Function keeps for its backward (other than
the op's inputs), so that the op's registered autograd can hand them to the backward op.

Custom ops take and return tensors (optional tensors only as inputs) and a few scalar types,
so an absent tensor output (None) travels as an empty placeholder, and the Function's
non-tensor options travel as float, int and bool arguments.
"""

from __future__ import annotations

import torch

NAMESPACE = "mixer_harness"


def op_name(name: str) -> str:
    """The qualified custom-op name of `name` in this project's namespace."""
    return f"{NAMESPACE}::{name}"


class FunctionContext:
    """Stands in for the ctx of a torch.autograd.Function, so that a custom op can call the
    Function's forward and backward staticmethods as plain functions.

    forward stores its saved tensors and attributes here; the backward op builds a context
    from the saved tensors and the attributes the forward would have set. Gradients reach
    the backward as the custom op's autograd passes them, so set_materialize_grads is a no-op.
    """

    def __init__(self, saved: tuple[torch.Tensor | None, ...] = (), **attributes: object):
        self._saved = tuple(saved)
        for name, value in attributes.items():
            setattr(self, name, value)

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self._saved

    def set_materialize_grads(self, value: bool) -> None:
        pass


def placeholder(device: torch.device) -> torch.Tensor:
    """The stand-in for an absent tensor output: an empty fp32 tensor on `device`."""
    return torch.empty(0, dtype=torch.float32, device=device)


def or_placeholder(t: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """t itself, or a placeholder where it is None."""
    return t if t is not None else placeholder(device)


def fake_like(t: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """A fake output shaped like t (a gradient of t), or a placeholder where t is None."""
    return torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None else placeholder(device)


def present(t: torch.Tensor, exists: bool) -> torch.Tensor | None:
    """Undo or_placeholder: t where `exists` (decided by the caller's flags, never by t's
    size, which under torch.compile may be symbolic), else None."""
    return t if exists else None
