"""The mixer registry: registry name -> mixer class (docs/design.md §4).

In-repo mixers register with `@register_mixer("name")`. A third-party package registers
its own through the entry-point group `harness.mixers` in its pyproject.toml:

    [project.entry-points."harness.mixers"]
    my_mixer = "my_package.my_module:MyMixer"

or by calling `register_mixer("my_mixer")(MyMixer)` before the harness runs.
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from mixers.base import Mixer

_MIXERS: dict[str, type["Mixer"]] = {}
_entry_points_loaded = False


class UnknownMixerError(ValueError):
    """Raised for a mixer name that is not registered; carries the valid names."""

    def __init__(self, name: str, valid: list[str]):
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        super().__init__(f"unknown mixer {name!r}; valid mixers: {', '.join(valid)}.{hint}")
        self.name, self.valid, self.closest = name, valid, (close[0] if close else None)


def register_mixer(name: str) -> Callable[[type["Mixer"]], type["Mixer"]]:
    """Class decorator registering a Mixer subclass under `name`."""

    def wrap(cls: type["Mixer"]) -> type["Mixer"]:
        if name in _MIXERS and _MIXERS[name] is not cls:
            raise ValueError(f"mixer name {name!r} is already registered to {_MIXERS[name].__qualname__}")
        cls.registry_name = name
        _MIXERS[name] = cls
        return cls

    return wrap


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group="harness.mixers"):
        cls = ep.load()
        if ep.name not in _MIXERS:
            register_mixer(ep.name)(cls)


def _ensure_builtin() -> None:
    import mixers.builtin  # noqa: F401  (registers the in-repo mixers)

    _load_entry_points()


def mixer_names() -> list[str]:
    """All registered mixer names, in registration order."""
    _ensure_builtin()
    return list(_MIXERS)


def get_mixer(name: str) -> type["Mixer"]:
    """The class registered under `name`; UnknownMixerError with the valid names otherwise."""
    _ensure_builtin()
    if name not in _MIXERS:
        raise UnknownMixerError(name, list(_MIXERS))
    return _MIXERS[name]
