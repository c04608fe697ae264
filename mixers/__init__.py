"""Sequence-mixer layers (docs/design.md §4) and their registry."""

from mixers.base import Mixer, MixerConfig
from mixers.registry import UnknownMixerError, get_mixer, mixer_names, register_mixer


def build_mixer(name: str, d_model: int, options: dict | None = None) -> Mixer:
    """Build the mixer registered as `name` for width d_model, options validated by its Config."""
    return get_mixer(name).from_options(d_model, options)


__all__ = ["Mixer", "MixerConfig", "UnknownMixerError", "build_mixer", "get_mixer", "mixer_names", "register_mixer"]
