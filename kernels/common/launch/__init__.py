"""Launch settings of the Triton kernels: frozen typed objects, one per kernel, one per op.

Each Triton kernel has a frozen dataclass of what its launch takes besides the tensors:
tile caps (BK over keys, BV over values: powers of two, capped by the next power of two of
the real dimension, at least 16), num_warps, num_stages and the kernel's own switches. An
op's settings object groups its kernels' objects (ChunkLaunch for linear_attention and
gated_linear_attention, DeltaLaunch for delta_rule and gated_delta_rule, MesaLaunch,
LinGdnLaunch); DEFAULTS holds one per op, and nothing here is ever changed in place.

    settings("gated_delta_rule").wy_fwd.num_warps              # the settings in effect
    with launch_settings(gated_delta_rule={"fused_fwd": {"enabled": True, "min_heads": 1}}):
        ...                                                     # overridden inside the block
    settings_in_effect(["gated_delta_rule"])                   # as a JSON-able dict

launch_settings keeps its overrides in a context variable, so they hold for the code inside
the block (and in the same thread) only, and nest. Autograd may run a backward on another
thread, where the variable holds its defaults: the Triton ops therefore read their settings
when the forward runs and hand them to their backward explicitly (encode / decode).

Runs record what their Triton ops used: within `recording_launches()`, each op's forward
calls note_launch(op) and the settings it ran with land in the yielded dict, which the
runner writes into the run record's `launch` field.

The defaults were measured on one H200 at K = V = 128 (2026-11-29, before the kernels task:
`git show 4509c5c:results/bench/<h200_linear_gla,h200_linear_gla_tune,h200_delta,h200_mesa>.json`);
the kernels task times alternatives under launch_settings (its `launch` field, a sweep's
`vary`: configs/kernels-launch.yaml). This package imports neither torch nor triton.

    base.py      what every kernel's settings share (KernelLaunch, TileLaunch, ...)
    chunk.py     linear_attention and gated_linear_attention (ChunkLaunch)
    delta.py     delta_rule and gated_delta_rule (DeltaLaunch)
    mesa.py      mesa (MesaLaunch)
    lin_gdn.py   linearized_softmax_gdn's own kernels (LinGdnLaunch)
    defaults.py  DEFAULTS, and the measurements behind them
    here         settings, launch_settings, encode / decode, recording_launches
"""


from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from kernels.common.launch.base import (
    FP32_DOTS,
    GRID_YZ_MAX,
    TILE_WIDTHS,
    KernelLaunch,
    NarrowingLaunch,
    NarrowVLaunch,
    SequentialLaunch,
    TileLaunch,
)
from kernels.common.launch.chunk import ChunkLaunch, DqkgLaunch, DqkLaunch, FusedForwardLaunch, IntraALaunch, PathLaunch
from kernels.common.launch.defaults import DEFAULTS
from kernels.common.launch.delta import (
    DeltaLaunch,
    DqkwLaunch,
    FusedStateLaunch,
    StateBwdLaunch,
    StatePassLaunch,
    WyBwdLaunch,
    WyFwdLaunch,
)
from kernels.common.launch.lin_gdn import MEAN_ACC_RULES, MEAN_FORMS, LinGdnLaunch, PrepLaunch
from kernels.common.launch.mesa import DOT_PRECISIONS, SOLVE_OPERANDS, GradsLaunch, MesaLaunch, SolveLaunch, StateLaunch

__all__ = [
    "DEFAULTS", "DOT_PRECISIONS", "FP32_DOTS", "GRID_YZ_MAX", "MEAN_ACC_RULES", "MEAN_FORMS", "SOLVE_OPERANDS",
    "TILE_WIDTHS", "ChunkLaunch", "DeltaLaunch", "DqkgLaunch", "DqkLaunch", "DqkwLaunch", "FusedForwardLaunch",
    "FusedStateLaunch", "GradsLaunch", "IntraALaunch", "KernelLaunch", "LinGdnLaunch", "MesaLaunch", "NarrowingLaunch",
    "NarrowVLaunch", "PathLaunch", "PrepLaunch", "SequentialLaunch", "SolveLaunch", "StateBwdLaunch", "StateLaunch",
    "StatePassLaunch", "TileLaunch", "WyBwdLaunch", "WyFwdLaunch", "as_dict", "decode", "encode", "launch_settings",
    "note_launch", "recording_launches", "settings", "settings_in_effect", "with_changes",
]


_OVERRIDES: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "launch_overrides", default=MappingProxyType({}))
_USED: contextvars.ContextVar[dict[str, dict[str, Any]] | None] = contextvars.ContextVar("launch_used", default=None)

S = TypeVar("S")


def _op_check(op: str) -> None:
    if op not in DEFAULTS:
        raise ValueError(f"no launch settings for op {op!r}; ops with Triton kernels: {sorted(DEFAULTS)}")


def settings(op: str) -> Any:
    """The settings object of `op` in effect here (DEFAULTS[op] unless launch_settings says otherwise)."""
    _op_check(op)
    return _OVERRIDES.get().get(op, DEFAULTS[op])


def _coerce(current: Any, value: Any, where: str) -> Any:
    """`value` as the type of the field it replaces (JSON gives 0/1 for switches, ints for floats)."""
    if isinstance(current, bool):
        if value not in (0, 1, True, False):
            raise ValueError(f"{where}: expected a switch (true/false or 0/1), got {value!r}")
        return bool(value)
    if isinstance(current, int):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    if isinstance(current, str):
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise ValueError(f"{where}: cannot set a field of type {type(current).__name__}")


def with_changes(obj: S, changes: S | Mapping[str, Any], where: str = "") -> S:
    """`obj` with `changes` applied: a settings object of obj's type replaces it whole; a
    mapping replaces the fields it names, recursing into nested settings objects (so
    {"bwd_dqkg": {"split_paths": False}} changes one field of one kernel). Unknown names
    and ill-typed values raise ValueError; every result is validated by its __post_init__."""
    where = where or type(obj).__name__
    if dataclasses.is_dataclass(changes) and not isinstance(changes, type):
        if type(changes) is not type(obj):
            raise ValueError(f"{where}: expected a {type(obj).__name__}, got a {type(changes).__name__}")
        return changes  # type: ignore[return-value]
    if not isinstance(changes, Mapping):
        raise ValueError(f"{where}: expected a mapping of field changes or a {type(obj).__name__}, got {changes!r}")
    names = {f.name for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
    new: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in names:
            raise ValueError(f"{where}: no setting {name!r}; it has {sorted(names)}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            new[name] = with_changes(current, value, f"{where}.{name}")
        else:
            new[name] = _coerce(current, value, f"{where}.{name}")
    return dataclasses.replace(obj, **new)  # type: ignore[type-var]


@contextlib.contextmanager
def launch_settings(**ops: Any) -> Iterator[None]:
    """Run the block under other launch settings: each keyword is an op name, its value a
    settings object of that op's type or a mapping of changes (with_changes) applied on
    top of the settings in effect at entry. Restored on exit; nests; no global changes.

        with launch_settings(linear_attention={"fwd_states": {"BK": 64}}):
            ...
    """
    current = _OVERRIDES.get()
    new = dict(current)
    for op, changes in ops.items():
        new[op] = with_changes(settings(op), changes, op)
    token = _OVERRIDES.set(MappingProxyType(new))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def as_dict(obj: Any) -> dict[str, Any]:
    """A settings object as nested plain dicts (JSON-able)."""
    return dataclasses.asdict(obj)


def settings_in_effect(ops: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """op -> its settings in effect here, as a JSON-able dict; every op with Triton kernels
    when `ops` is None."""
    return {op: as_dict(settings(op)) for op in (DEFAULTS if ops is None else ops)}


def encode(op: str) -> str:
    """The settings of `op` in effect here as a JSON string: how a forward hands them to its
    backward (custom ops take strings, not objects)."""
    return json.dumps(as_dict(settings(op)), sort_keys=True)


@functools.lru_cache(maxsize=256)
def decode(op: str, text: str) -> Any:
    """The settings object `encode(op)` wrote."""
    _op_check(op)
    return with_changes(DEFAULTS[op], json.loads(text), op)


@contextlib.contextmanager
def recording_launches() -> Iterator[dict[str, dict[str, Any]]]:
    """Collect, into the yielded dict, op -> the settings (JSON-able) each Triton op ran its
    first forward with inside the block."""
    used: dict[str, dict[str, Any]] = {}
    token = _USED.set(used)
    try:
        yield used
    finally:
        _USED.reset(token)


def note_launch(op: str) -> Any:
    """The settings of `op` in effect here, noted for recording_launches (the first call of
    each op inside a recording counts)."""
    current = settings(op)
    used = _USED.get()
    if used is not None and op not in used:
        used[op] = as_dict(current)
    return current
