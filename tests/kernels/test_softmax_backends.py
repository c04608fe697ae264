"""Softmax attention's FlashAttention backends on the CPU, through fake FA packages.

FA4 (flash_attn.cute), FA3 (flash_attn_interface) and FA2 (flash_attn) are stood in for by
modules whose flash_attn_func computes attention by SDPA with the bottom-right causal mask the
real kernels use, and the one device check (dispatch.device_capability) is replaced, so that
the resolution order of "auto", every refusal and the dispatch to each backend run here. Each
fake notes its calls: a test that asserts a backend ran reads what actually ran.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from kernels.common import dispatch
from kernels.softmax_attention import KVCache, softmax_attention
from kernels.softmax_attention.spec import SPEC, auto_choice, explain_auto
from tests.util import TOL, rel_err

B, H = 2, 3
HALF = [torch.float16, torch.bfloat16]


def bottom_right_attention(q, k, v, softmax_scale=None, causal=False):
    """Attention of q [B, T, H, K] over k [B, S+T, H, K], v [B, S+T, H, V] with the causal mask
    aligned bottom-right (query t sees keys up to S + t): the FlashAttention convention."""
    T, N = q.shape[1], k.shape[1]
    mask = torch.ones(T, N, dtype=torch.bool).tril(diagonal=N - T) if causal else None
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        attn_mask=mask, scale=softmax_scale)
    return o.transpose(1, 2).to(q.dtype)


class FakeFlash:
    """Fake FA packages in sys.modules and the presence cache; calls[name] lists the keyword
    arguments of each call of that version's flash_attn_func."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.monkeypatch = monkeypatch
        self.calls: dict[str, list[dict]] = {"fa4": [], "fa3": [], "flash_attn": []}

    def _func(self, backend: str, returns_lse: bool):
        def flash_attn_func(q, k, v, *args, softmax_scale=None, causal=False, **options):
            assert not args, f"{backend}: pass everything after q, k, v by keyword"
            self.calls[backend].append({"softmax_scale": softmax_scale, "causal": causal, **options})
            o = bottom_right_attention(q, k, v, softmax_scale, causal)
            return (o, torch.zeros(q.shape[0], q.shape[2], q.shape[1])) if returns_lse else o
        return flash_attn_func

    def install(self, *backends: str, fa2_version: str = "2.8.3", capability=(9, 0), cutlass: bool = True):
        """Make `backends` present (the others absent) on a GPU of `capability` (None: no GPU)."""
        mp = self.monkeypatch
        package = types.ModuleType("flash_attn")
        if "flash_attn" in backends:
            package.__version__ = fa2_version
            package.flash_attn_func = self._func("flash_attn", returns_lse=False)
        if "fa4" in backends:
            package.cute = types.ModuleType("flash_attn.cute")
            package.cute.flash_attn_func = self._func("fa4", returns_lse=True)  # FA4 returns (out, lse)
            mp.setitem(sys.modules, "flash_attn.cute", package.cute)
        mp.setitem(sys.modules, "flash_attn", package)
        interface = types.ModuleType("flash_attn_interface")
        interface.flash_attn_func = self._func("fa3", returns_lse=False)
        mp.setitem(sys.modules, "flash_attn_interface", interface)
        for name, present in (("flash_attn", "flash_attn" in backends), ("flash_attn.cute", "fa4" in backends),
                              ("cutlass", cutlass), ("flash_attn_interface", "fa3" in backends)):
            mp.setitem(dispatch._PRESENT, name, present)
        mp.setattr(dispatch, "device_capability", lambda device: capability)
        return self


@pytest.fixture
def fake(monkeypatch):
    return FakeFlash(monkeypatch)


def make(T, K, V, S, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen).to(dtype)
    cache = KVCache(torch.randn(B, S, H, K, generator=gen).to(dtype), torch.randn(B, S, H, V, generator=gen).to(dtype))
    return q, k, v, (cache if S else None)


@pytest.mark.parametrize("present, capability, dtype, expected", [
    (("fa4", "fa3", "flash_attn"), (9, 0), torch.bfloat16, "fa4"),
    (("fa3", "flash_attn"), (9, 0), torch.bfloat16, "fa3"),
    (("flash_attn",), (9, 0), torch.float16, "flash_attn"),
    ((), (9, 0), torch.bfloat16, "torch"),
    (("fa4", "fa3", "flash_attn"), (8, 0), torch.bfloat16, "flash_attn"),  # fa4 and fa3 start at sm90
    (("fa4", "fa3"), (8, 6), torch.bfloat16, "torch"),
    (("fa4", "fa3", "flash_attn"), (7, 5), torch.float16, "torch"),  # FA2 starts at sm80
    (("fa4", "fa3", "flash_attn"), (9, 0), torch.float32, "torch"),
    (("fa4", "fa3", "flash_attn"), (9, 0), torch.float64, "torch"),
    (("fa4", "fa3", "flash_attn"), None, torch.bfloat16, "torch"),  # no CUDA device
])
def test_auto_takes_the_first_usable_flash_attention(fake, present, capability, dtype, expected):
    fake.install(*present, capability=capability)
    assert SPEC.resolve("auto", "cpu", dtype) == expected


def test_auto_needs_the_cute_dsl_for_fa4(fake):
    fake.install("fa4", "fa3", cutlass=False)
    chosen, passed = auto_choice("cpu", torch.bfloat16)
    assert chosen == "fa3" and "nvidia-cutlass-dsl" in passed[0].reason


@pytest.mark.parametrize("backend", ["fa4", "fa3", "flash_attn"])
@pytest.mark.parametrize("S", [0, 5])
@pytest.mark.parametrize("dtype", HALF)
def test_each_backend_runs_its_package_with_the_cache(fake, backend, S, dtype):
    """The op hands the cache and the new keys to the package in one call (causal, the op's
    scale), returns out alone (FA4's (out, lse) unpacked) and the cache of S + T tokens."""
    fake.install("fa4", "fa3", "flash_attn")
    q, k, v, cache = make(7, 16, 16, S, dtype)
    o, final = softmax_attention(q, k, v, scale=0.3, initial_state=cache, output_final_state=True, backend=backend)
    assert len(fake.calls[backend]) == 1 and sum(map(len, fake.calls.values())) == 1
    assert fake.calls[backend][0]["softmax_scale"] == 0.3 and fake.calls[backend][0]["causal"] is True
    o_ref, final_ref = softmax_attention(q, k, v, scale=0.3, initial_state=cache, output_final_state=True,
                                         backend="reference")
    assert o.dtype == dtype and o.shape == (B, 7, H, 16)
    assert rel_err(o, o_ref) < TOL[dtype]
    assert torch.equal(final.k, final_ref.k) and torch.equal(final.v, final_ref.v) and final.k.shape[1] == S + 7


def test_fa4_takes_unequal_head_dims(fake):
    fake.install("fa4")
    q, k, v, cache = make(6, 32, 16, 3, torch.bfloat16)
    o, _ = softmax_attention(q, k, v, initial_state=cache, backend="fa4")
    o_ref, _ = softmax_attention(q, k, v, initial_state=cache, backend="reference")
    assert rel_err(o, o_ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("backend, label", [("fa4", "FlashAttention-4"), ("fa3", "FlashAttention-3"),
                                            ("flash_attn", "FlashAttention-2")])
def test_refusals_name_what_is_wrong_and_what_is_valid(fake, backend, label):
    q, k, v, _ = make(4, 16, 16, 0, torch.bfloat16)
    fake.install(capability=(9, 0))
    with pytest.raises(ValueError, match=rf"backend='{backend}' cannot run on cpu: {label} .*is not installed"):
        softmax_attention(q, k, v, backend=backend)
    fake.install("fa4", "fa3", "flash_attn", capability=None)
    with pytest.raises(ValueError, match=rf"{label} .*needs a CUDA device, got cpu"):
        softmax_attention(q, k, v, backend=backend)
    fake.install("fa4", "fa3", "flash_attn", capability=(7, 5))
    with pytest.raises(ValueError, match=r"needs sm(90|80) or newer, got sm75"):
        softmax_attention(q, k, v, backend=backend)
    fake.install("fa4", "fa3", "flash_attn")
    for dtype in (torch.float32, torch.float64):
        with pytest.raises(ValueError, match=rf"backend='{backend}' takes float16 or bfloat16 inputs, got "
                                             rf"{str(dtype)[6:]}; use backend='torch'"):
            softmax_attention(q.to(dtype), k.to(dtype), v.to(dtype), backend=backend)
    assert not fake.calls[backend]


def test_fp32_is_refused_when_a_mixer_resolves(fake):
    """The dtype refusal comes from resolution (what mixers and tasks call first), not the call."""
    fake.install("fa4")
    with pytest.raises(ValueError, match="backend='fa4' takes float16 or bfloat16"):
        dispatch.resolve_backend("softmax_attention", "fa4", "cpu", torch.float32)
    assert dispatch.resolve_backend("softmax_attention", "fa4", "cpu", torch.bfloat16) == "fa4"


@pytest.mark.parametrize("backend, K, V, capability, message", [
    ("fa3", 16, 8, (9, 0), "needs equal head dims"),
    ("flash_attn", 16, 8, (9, 0), "needs equal head dims"),
    ("fa3", 12, 12, (9, 0), "multiples of 8"),
    ("fa4", 12, 16, (9, 0), "multiples of 8"),
    ("fa4", 264, 264, (9, 0), "from 8 to 256 on sm90"),
    ("fa4", 160, 160, (10, 0), r"up to 128, \(192, 128\) or \(256, 256\) on sm10x"),
    ("flash_attn", 264, 264, (9, 0), "up to 256"),
])
def test_head_dims_a_version_cannot_take_are_refused(fake, backend, K, V, capability, message):
    fake.install("fa4", "fa3", "flash_attn", capability=capability)
    q, k, v, _ = make(3, K, V, 0, torch.float16)
    with pytest.raises(ValueError, match=rf"{message}.*use backend='torch'"):
        softmax_attention(q, k, v, backend=backend)
    assert not fake.calls[backend]


def test_fa2_before_2_1_refuses_a_cache_and_runs_without_one(fake):
    """FA2 < 2.1 aligns its causal mask top-left: with S cached keys its answer is wrong."""
    fake.install("flash_attn", fa2_version="2.0.9")
    q, k, v, cache = make(4, 16, 16, 3, torch.float16)
    with pytest.raises(ValueError, match=r"needs flash-attn >= 2.1 .*got 2.0.9.*backend='torch'"):
        softmax_attention(q, k, v, initial_state=cache, backend="flash_attn")
    softmax_attention(q, k, v, backend="flash_attn")
    assert len(fake.calls["flash_attn"]) == 1


def test_auto_on_the_cpu_says_why_flash_attention_is_not_usable(fake):
    line = explain_auto("cpu", torch.bfloat16)
    assert line.startswith("auto runs torch (SDPA) for bfloat16 on cpu; passed over")
    for name in ("fa4", "fa3", "flash_attn"):
        assert f"{name}: " in line or f"{name}," in line
    fake.install("fa4", "fa3", "flash_attn", capability=None)
    line = explain_auto("cpu", torch.bfloat16)
    assert line.count("needs a CUDA device, got cpu") == 3
    assert "takes float16 or bfloat16 inputs, got float32" in explain_auto("cpu", torch.float32)
    fake.install("fa4")
    assert explain_auto("cpu", torch.bfloat16) == "auto runs fa4 for bfloat16 on cpu"


def test_the_mixer_records_the_backend_that_ran(fake):
    from mixers import build_mixer

    fake.install("fa3", "flash_attn")
    mixer = build_mixer("softmax", 32, {"num_heads": 2}).to(torch.bfloat16)
    mixer(torch.randn(1, 5, 32, dtype=torch.bfloat16))
    assert mixer.backend_used == "fa3" and len(fake.calls["fa3"]) == 1
    mixer.float()(torch.randn(1, 5, 32))
    assert mixer.backend_used == "torch" and len(fake.calls["fa3"]) == 1


def test_presence_is_found_without_importing(tmp_path, monkeypatch):
    """FA4's wheel leaves flash_attn a namespace (no __init__.py): FA4 is there, FA2 is not. A
    regular flash_attn is FA2; its cute folder, where present, is FA4. Nothing is imported."""
    only_fa4 = tmp_path / "only_fa4"
    (only_fa4 / "flash_attn" / "cute").mkdir(parents=True)
    (only_fa4 / "flash_attn" / "cute" / "__init__.py").write_text("raise ImportError('imported')\n")
    (only_fa4 / "flash_attn" / "cute" / "interface.py").write_text("")
    both = tmp_path / "both"
    (both / "flash_attn" / "cute").mkdir(parents=True)
    (both / "flash_attn" / "__init__.py").write_text("raise ImportError('imported')\n")
    (both / "flash_attn" / "cute" / "interface.py").write_text("")
    for root, fa2, fa4 in ((only_fa4, False, True), (both, True, True)):
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
        assert (dispatch._find("flash_attn"), dispatch._find("flash_attn.cute")) == (fa2, fa4)
        assert dispatch._find("flash_attn.cute.interface") and not dispatch._find("flash_attn.cute.nothing")
        assert "flash_attn" not in sys.modules
        monkeypatch.undo()


def test_harness_list_shows_each_softmax_backend_and_why(monkeypatch):
    from harness.cli import app

    out = CliRunner().invoke(app, ["list"], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    for name, label in (("fa4", "FlashAttention-4"), ("fa3", "FlashAttention-3"), ("flash_attn", "FlashAttention-2")):
        assert f"{name} " in text and label in text
    assert "softmax_attention auto runs" in text
