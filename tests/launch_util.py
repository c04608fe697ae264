"""Launch-setting overrides the kernel tests share (kernels/common/launch/), as the
mappings of changes launch_settings takes, and LaunchSpy, which shows a test what a kernel
was launched with."""

from __future__ import annotations

import dataclasses
from typing import Any

CHUNK_OPS = ("linear_attention", "gated_linear_attention")
DELTA_OPS = ("delta_rule", "gated_delta_rule")
# the ChunkLaunch fields of the fused linear/GLA forward, one per gate mode
FUSED_FORWARD_FIELDS = ("fwd_fused", "fwd_fused_scalar", "fwd_fused_vector")
TILE_FIELDS = ("BK", "BV", "BC", "min_BV", "max_BK", "max_BD", "min_BD")


def each(ops: tuple[str, ...], changes: Any) -> dict[str, Any]:
    """The same changes for several ops: launch_settings(**each(CHUNK_OPS, {...}))."""
    return {op: changes for op in ops}


def fused_forward_changes(**fields: Any) -> dict[str, dict[str, Any]]:
    """Changes of the fused linear/GLA forward of every gate mode, e.g. fused_forward_changes(min_heads=1)."""
    return {name: dict(fields) for name in FUSED_FORWARD_FIELDS}


def small_tiles(settings: Any, **extra: Any) -> dict[str, dict[str, Any]]:
    """Changes that set every tile cap of an op's settings object (BK, BV, min_BV and mesa's
    state and key-column blocks) to 16, and the fields in `extra` wherever a kernel has them
    (e.g. min_heads=1)."""
    changes: dict[str, dict[str, Any]] = {}
    for f in dataclasses.fields(settings):
        kernel = getattr(settings, f.name)
        if not dataclasses.is_dataclass(kernel):
            continue
        names = {g.name for g in dataclasses.fields(kernel)}
        small = {key: 16 for key in TILE_FIELDS if key in names}
        small.update({key: value for key, value in extra.items() if key in names})
        if small:
            changes[f.name] = small
    return changes


class LaunchSpy:
    """Stands in for a jitted kernel (monkeypatched over it): hands each launch's keyword
    arguments to `note`, then launches."""

    def __init__(self, kernel, note):
        self.kernel, self.note = kernel, note

    def __getitem__(self, grid):
        def launch_kernel(*args, **kwargs):
            self.note(kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch_kernel


def calls_of(monkeypatch, module: Any, name: str) -> list[int]:
    """A list that grows by one at each call of module.<name> (monkeypatched to count, then run):
    whether a launch path ran at all."""
    calls: list[int] = []
    fn = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    return calls
