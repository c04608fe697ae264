"""Decay initialisation ranges of the Mamba2-style gates (gdn, mesa)."""

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from mixers import build_mixer


@pytest.mark.parametrize("name", ["gdn", "mesa"])
def test_decay_starts_inside_the_configured_ranges(name):
    torch.manual_seed(0)
    m = build_mixer(name, 64, {"num_heads": 8, "decay_A_range": (2.0, 3.0), "decay_dt_range": (1e-4, 1e-3)})
    A, dt = m.A_log.exp(), F.softplus(m.dt_bias)
    assert ((A >= 2.0 - 1e-6) & (A <= 3.0 + 1e-6)).all()
    assert ((dt >= 1e-4 * 0.999) & (dt <= 1e-3 * 1.001)).all()


def test_default_ranges_are_mamba2s():
    torch.manual_seed(1)
    m = build_mixer("gdn", 64, {"num_heads": 16})
    A, dt = m.A_log.exp(), F.softplus(m.dt_bias)
    assert A.min() >= 1.0 - 1e-6 and A.max() <= 16.0 + 1e-6
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 1e-1 * 1.001


@pytest.mark.parametrize("bad", [(2.0, 1.0), (0.0, 1.0), (-1.0, 1.0)])
def test_bad_ranges_are_refused_with_the_field_name(bad):
    with pytest.raises(ValidationError, match="decay_dt_range"):
        build_mixer("gdn", 64, {"decay_dt_range": bad})


@pytest.mark.parametrize("name,default", [("gla", True), ("linear", False), ("gdn", True)])
def test_output_gate_option_overrides_the_mixer_default(name, default):
    assert build_mixer(name, 32, {}).gated_output is default
    flipped = build_mixer(name, 32, {"output_gate": not default})
    assert flipped.gated_output is (not default)
    assert hasattr(flipped, "g_proj") is (not default)
    x = torch.randn(2, 9, 32)
    assert flipped(x).shape == x.shape
