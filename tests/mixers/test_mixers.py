"""Every registered mixer: shapes, backend recorded, prefill + step decoding equals a full
forward, state sizes, and lin_gdn loading a softmax layer's weights unchanged."""

import pytest
import torch

from mixers import build_mixer, mixer_names

ALL = ["softmax", "linear", "gla", "deltanet", "gdn", "lin_gdn", "mesa"]
D = 32


def test_registry_has_the_seven():
    assert set(ALL) <= set(mixer_names())


def _build(name, **options):
    torch.manual_seed(0)
    opts = {"num_heads": 2, **options}
    if name == "mesa":
        opts.setdefault("cg_steps", 40)
    return build_mixer(name, D, opts).double()


@pytest.mark.parametrize("name", ALL)
def test_forward_shape_and_backend(name):
    m = _build(name)
    x = torch.randn(2, 37, D, dtype=torch.float64)
    y = m(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    assert m.backend_used == ("torch")
    y.sum().backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("short_conv", [True, False])
def test_prefill_then_step_equals_forward(name, short_conv):
    m = _build(name, short_conv=short_conv)
    x = torch.randn(2, 21, D, dtype=torch.float64)
    with torch.no_grad():
        full = m(x)
        out, cache = m.prefill(x[:, :13])
        steps = [out]
        for t in range(13, 21):
            y_t, cache = m.step(x[:, t], cache)
            steps.append(y_t.unsqueeze(1))
    got = torch.cat(steps, dim=1)
    tol = 1e-6 if name == "mesa" else 1e-9
    torch.testing.assert_close(got, full, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ALL)
def test_state_size(name):
    m = _build(name)
    s64, s128 = m.state_size(64), m.state_size(128)
    assert s64 > 0
    if name == "softmax":
        assert s128 > s64, "a KV cache grows with the context"
    else:
        assert s128 == s64, "a recurrent state does not"


def test_lin_gdn_loads_softmax_weights():
    soft = _build("softmax")
    lin = _build("lin_gdn")
    lin.load_state_dict(soft.state_dict())  # strict: exactly the same parameters
    vala = _build("lin_gdn", form="vala")
    vala.load_state_dict(soft.state_dict())
    x = torch.randn(1, 9, D, dtype=torch.float64)
    assert lin(x).shape == vala(x).shape == x.shape


def test_bad_options():
    with pytest.raises(ValueError, match="num_heads"):
        build_mixer("gdn", D, {"num_heads": 0})
    with pytest.raises(ValueError, match="extra|not permitted"):
        build_mixer("gdn", D, {"nonsense": 1})


@pytest.mark.parametrize("name", mixer_names())
def test_decode_backend_is_named(name):
    """Which step a decode runs is known before it runs, for the record: the fused Triton
    step only for the four ops that have one, on CUDA, unless the mixer is pinned to torch."""
    mixer = build_mixer(name, 16, {"num_heads": 2})
    assert mixer.decode_backend(torch.device("cpu"), torch.float32) == "torch"
    assert mixer.has_fused_step == (name in ("linear", "gla", "deltanet", "gdn"))
    pinned = build_mixer(name, 16, {"num_heads": 2, "backend": "torch"})
    assert pinned.step_backend() == "torch"
