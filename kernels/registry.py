"""Every op's OpSpec, by name: the one table that lists the ops (kernels.common.spec).

Adding an op is one folder kernels/<op>/ (with spec.py defining its OpSpec) and one line
below, "module:attribute" of that spec. The order is the order of kernels.OPS.
"""

from __future__ import annotations

import torch

from kernels.common.dispatch import backend_status, triton_interpret
from kernels.common.spec import OpSpec, load_entry

_SPECS = (
    "kernels.softmax_attention.spec:SPEC",
    "kernels.linear_attention.spec:SPEC",
    "kernels.gated_linear_attention.spec:SPEC",
    "kernels.delta_rule.spec:SPEC",
    "kernels.gated_delta_rule.spec:SPEC",
    "kernels.linearized_softmax_gdn.spec:SPEC",
    "kernels.mesa.spec:SPEC",
    "kernels.linearized_softmax_gdn.spec:VALA_SPEC",
)


def _load(path: str) -> OpSpec:
    spec = load_entry(path)
    if not isinstance(spec, OpSpec):
        raise TypeError(f"kernels.registry: {path} is a {type(spec).__name__}, not an OpSpec")
    return spec


SPECS: dict[str, OpSpec] = {spec.name: spec for spec in map(_load, _SPECS)}


def _preload_triton_entries() -> None:
    """Import every op's Triton entry module where Triton runs (CUDA, or the interpreter), so
    that torch.compile never meets a first import while tracing (an import is a graph break)."""

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not triton_interpret():
        return
    if not backend_status("triton", device).usable:
        return
    for spec in SPECS.values():
        entry = spec.backends.get("triton")
        if entry is not None and isinstance(entry.entry, str):
            load_entry(entry.entry)


_preload_triton_entries()


def op_spec(name: str) -> OpSpec:
    """The spec of op `name`; ValueError naming the registered ops when there is none."""
    if name not in SPECS:
        raise ValueError(f"no op named {name!r}; registered ops: {', '.join(SPECS)}")
    return SPECS[name]


def op_names(role: str = "op") -> tuple[str, ...]:
    """The registered ops of `role`: "op" (the contract's ops) or "baseline"."""
    return tuple(name for name, spec in SPECS.items() if spec.role == role)
