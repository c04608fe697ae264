"""What the project knows of one op, in one object: `OpSpec`, and the one dispatch every op runs.

An op folder `kernels/<op>/` defines its spec in `spec.py` (`SPEC = OpSpec(...)`), and the
public function in `__init__.py` keeps its signature and docstring and hands its arguments to
`dispatch`: validate (the spec's `validate`), resolve the backend (kernels.common.dispatch),
call that backend's entry point. Everything else that needs to know the op (FLOP counts, the
FLA comparison, benchmarks, compile checks) reads the spec through kernels.registry.

Entry points are callables or lazy "module:attribute" strings, imported when first called,
so that optional packages (triton, flash_attn, fla) are imported only where they run. A string
entry is looked up again on every call (the module is cached by Python): a test that wraps the
function on its defining module sees the op call the wrapper.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from kernels.common.dispatch import auto_kernel, choose_backend

Entry = Callable[..., Any] | str
# (B, T, H, K, V, **options) -> a count; options are the op's own (chunk_size, cg_steps, ...).
ShapeCount = Callable[..., float]


def load_entry(entry: Entry) -> Callable[..., Any]:
    """The callable behind an entry point: itself, or for "module:attr.path" the attribute
    path looked up on the imported module. Raises ImportError when the module is missing."""
    if callable(entry):
        return entry
    module, _, path = entry.partition(":")
    if not path:
        raise ValueError(f"entry point {entry!r} must be a callable or 'module:attribute'")
    if module not in sys.modules:
        # __import__ rather than importlib.import_module: dynamo traces the builtin (it runs
        # the import while tracing) but refuses importlib's function (a graph break).
        __import__(module)
    target: Any = sys.modules[module]
    for name in path.split("."):
        target = getattr(target, name)
    return target


@dataclass(frozen=True)
class Backend:
    """One way to compute an op: the entry point and the validated arguments it does not
    take (e.g. a per-token reference has no chunk_size). It is called with every other
    validated argument as a keyword."""

    entry: Entry
    ignores: tuple[str, ...] = ()


def chunked_backends(reference: Entry, torch_form: Entry, triton: str) -> dict[str, Backend]:
    """The backends of a chunkwise op: a per-token reference (no chunk_size), the PyTorch
    chunked form and the Triton kernels (a lazy entry point: triton is optional)."""
    return {"reference": Backend(reference, ignores=("chunk_size",)), "torch": Backend(torch_form),
            "triton": Backend(triton)}


@dataclass(frozen=True)
class Counts:
    """FLOP counts of one call on [B, T, H, K/V] inputs (conventions: tasks/common/flops.py).

    forward(B, T, H, K, V, **options): forward FLOPs (options: the op's chunk_size,
    cg_steps, ...; those it does not use are ignored); fwdbwd_factor: forward+backward over
    forward; decode(B, H, K, V, context): FLOPs of one decode step after `context` tokens.
    Bytes need no per-op count: `io_bytes` reads them off the arguments and outputs."""

    forward: ShapeCount
    fwdbwd_factor: float
    decode: Callable[[int, int, int, int, int], float]

    def flops(self, phase: str, B: int, T: int, H: int, K: int, V: int, **options: Any) -> float:
        """FLOPs of phase "fwd" or "fwdbwd"."""
        if phase not in ("fwd", "fwdbwd"):
            raise ValueError(f"flops: phase must be 'fwd' or 'fwdbwd', got {phase!r}")
        fwd = self.forward(B, T, H, K, V, **options)
        return fwd * (self.fwdbwd_factor if phase == "fwdbwd" else 1.0)


@dataclass(frozen=True)
class FlaKernel:
    """FLA's equivalent of an op (flash-linear-attention, optional, CUDA only).

    entry: the kernel, e.g. "fla.ops:gla.chunk_gla"; call(kernel, args) -> o runs it on the
    op's keyword arguments (q, k, v, gates, options); mixer_args: what a mixer must add to
    its q, k, v and gates for `call` (config fields, or methods returning a tensor such as
    MesaNet's lamb)."""

    name: str
    entry: str
    call: Callable[[Callable[..., Any], dict[str, Any]], torch.Tensor]
    mixer_args: tuple[str, ...] = ()


# (B, T, H, K, V, *, variant, dtype, device, generator, state) -> the op's keyword arguments.
InputFactory = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class OpSpec:
    """One op: its public function and step, state, backends, checks, counts, FLA
    equivalent and inputs.

    name: the op's name (its folder, its error-message prefix, mixers' op_name).
    function, step: the public op and its one-token step (entry points; step None if none).
    state: the state the op takes and returns, in words with shapes.
    backends: backend name -> Backend, in the order error messages list them.
    validate(op, args, check_values) -> args: raises ValueError on bad input, returns the
      arguments the backends take (scale resolved, state normalised); args is the public
      call's arguments but backend and check_values.
    counts: FLOP counts (bytes: io_bytes).
    auto: (device, dtype) -> the backend "auto" picks (kernels.common.dispatch; default
      auto_kernel, Triton on CUDA). fla: FLA's kernel per input variant (absent: none).
    inputs: random valid arguments for tests, benchmarks and compile checks (InputFactory);
      variants: the input kinds the factory makes (e.g. GLA's "vector" and "scalar" gate),
      the first one the default; variant_of(args) names the variant of given arguments.
    role: "op" for the ops of the contract (kernels.OPS), "baseline" for comparison forms.
    """

    name: str
    function: Entry
    step: Entry | None
    state: str
    backends: Mapping[str, Backend]
    validate: Callable[[str, dict[str, Any], bool], dict[str, Any]]
    counts: Counts
    inputs: InputFactory
    auto: Callable[[torch.device, torch.dtype | None], str] = auto_kernel
    variants: tuple[str, ...] = ("default",)
    variant_of: Callable[[Mapping[str, Any]], str] = lambda args: "default"
    fla: Mapping[str, FlaKernel] = field(default_factory=dict)
    role: Literal["op", "baseline"] = "op"

    @property
    def backend_names(self) -> tuple[str, ...]:
        return tuple(self.backends)

    def make_inputs(self, B: int, T: int, H: int, K: int, V: int, variant: str | None = None,
                    **where: Any) -> dict[str, Any]:
        """Random valid keyword arguments of the op: q, k: [B, T, H, K], v: [B, T, H, V] and
        its gates, for input `variant` (default: the first of `variants`). where: dtype,
        device, seed, state (see kernels.common.inputs.factory)."""
        variant = variant or self.variants[0]
        if variant not in self.variants:
            raise ValueError(f"{self.name}: input variant {variant!r} is not known; valid: {', '.join(self.variants)}")
        return self.inputs(B, T, H, K, V, variant=variant, **where)

    def fla_kernel(self, variant: str) -> FlaKernel | None:
        """FLA's kernel for inputs of `variant`, or None when FLA has none."""
        return self.fla.get(variant)

    def resolve(self, requested: str, device: torch.device | str, dtype: torch.dtype | None = None) -> str:
        """The concrete backend that runs this op for tensors on `device` (see choose_backend)."""
        return choose_backend(self.name, self.backend_names, self.auto, requested, device, dtype)


def dispatch(spec: OpSpec, backend: str, check_values: bool = True, **args: Any) -> Any:
    """Run op `spec` on `args` (its public arguments but backend and check_values): validate
    them, resolve `backend` for q's device and dtype, call that backend's entry point.
    Returns what the entry point returns (the op's (o, state))."""
    args = spec.validate(spec.name, args, check_values)
    q = args["q"]
    chosen = spec.backends[spec.resolve(backend, q.device, q.dtype)]
    ignored = chosen.ignores
    return load_entry(chosen.entry)(**{k: v for k, v in args.items() if k not in ignored})


def io_bytes(*values: Any) -> float:
    """Bytes of every tensor in `values` (nested in tuples, lists and dicts): an op's
    arguments and outputs give the traffic that no implementation of it can avoid."""
    total = 0
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (tuple, list)):
            stack.extend(value)
    return float(total)
