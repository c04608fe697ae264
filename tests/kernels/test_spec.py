"""The op specs (kernels/common/spec.py, kernels/registry.py): every registered op's input
factory makes arguments its public function takes, its reference and torch backends agree
on them, and the generic dispatch keeps the ops' errors and backend rules."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.common.spec import io_bytes, load_entry
from kernels.registry import SPECS, op_spec
from tests.util import rel_err

CASES = [(name, variant) for name, spec in SPECS.items() for variant in spec.variants]


def test_the_registry_lists_every_op_once_under_its_folder_name():
    assert kernels.OPS == ("softmax_attention", "linear_attention", "gated_linear_attention", "delta_rule",
                           "gated_delta_rule", "linearized_softmax_gdn", "mesa")
    for name, spec in SPECS.items():
        assert spec.name == name
        assert load_entry(spec.function) is getattr(kernels, name)
        assert spec.step is None or load_entry(spec.step) is getattr(kernels, name + "_step")


@pytest.mark.parametrize("name,variant", CASES)
def test_factory_inputs_run_and_the_backends_agree(name, variant):
    spec = SPECS[name]
    has_state = spec.step is not None
    args = spec.make_inputs(1, 70, 2, 8, 8, variant=variant, dtype=torch.float64, state=has_state)
    assert spec.variant_of(args) == variant
    fn = load_entry(spec.function)
    extra = {"output_final_state": True} if has_state else {}
    outs = {b: fn(**args, backend=b, **extra) for b in ("reference", "torch")}
    assert rel_err(outs["torch"][0], outs["reference"][0]) < 1e-10
    again = spec.make_inputs(1, 70, 2, 8, 8, variant=variant, dtype=torch.float64, state=has_state)
    assert torch.equal(again["q"], args["q"]), "the same seed gives the same tensors"


def test_counts_and_bytes():
    linear, gdn = op_spec("linear_attention"), op_spec("gated_delta_rule")
    assert linear.counts.flops("fwdbwd", 1, 64, 1, 4, 4) == 3 * (4 * 64 * 16 + 2 * 64 * 64 * 8)
    assert gdn.counts.forward(2, 130, 3, 16, 16) > gdn.counts.forward(2, 128, 3, 16, 16)
    args = linear.make_inputs(2, 5, 3, 4, 6)
    assert io_bytes(args) == 4 * 2 * 5 * 3 * (4 + 4 + 6)
    with pytest.raises(ValueError, match="phase must be"):
        linear.counts.flops("bwd", 1, 1, 1, 1, 1)


def test_unknown_names_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="registered ops: softmax_attention, linear_attention"):
        op_spec("nope")
    with pytest.raises(ValueError, match="input variant 'dense' is not known; valid: vector, scalar"):
        op_spec("gated_linear_attention").make_inputs(1, 4, 1, 2, 2, variant="dense")
    with pytest.raises(ValueError, match="takes no initial state"):
        op_spec("vala_attention").make_inputs(1, 4, 1, 2, 2, state=True)
    with pytest.raises(ValueError, match=r"vala_attention: backend='triton' is not valid.*\['reference', 'torch'\]"):
        kernels.vala_attention(*op_spec("vala_attention").make_inputs(1, 4, 1, 2, 2).values(), backend="triton")
    with pytest.raises(ValueError, match="must be a callable or 'module:attribute'"):
        load_entry("kernels.mesa")


def test_an_unregistered_op_resolves_with_the_default_backends():
    assert kernels.resolve_backend("my_own_op", "auto", "cpu") == "torch"
    with pytest.raises(ValueError, match=r"my_own_op: backend='flash_attn' is not valid"):
        kernels.resolve_backend("my_own_op", "flash_attn", "cpu")
