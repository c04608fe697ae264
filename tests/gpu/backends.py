"""Which backend ran, for the GPU tests.

The tests force backend="triton", which raises rather than falls back
(kernels/common/dispatch.py), and also watch the Triton entry point the op dispatches to, so
that a comparison which ran PyTorch on both sides cannot pass. The ops return no record of
the backend that ran (a mixer keeps resolve_backend's answer in Mixer.backend_used); the
calls of the entry point are that record here.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from unittest import mock

# op -> (module, function): what the op calls when its backend is "triton". Every public op
# imports its entry point when called, so a wrapper set on the defining module is the one
# the op calls; "step" is the fused decoding step behind every linear op's *_step.
TRITON_ENTRIES = {
    "linear_attention": ("kernels.linear_attention.triton_op", "linear_attention_triton"),
    "gated_linear_attention": ("kernels.gated_linear_attention.triton_op", "gated_linear_attention_triton"),
    "delta_rule": ("kernels.delta_rule.triton_op", "delta_rule_triton"),
    "gated_delta_rule": ("kernels.gated_delta_rule.triton_op", "gated_delta_rule_triton"),
    "linearized_softmax_gdn": ("kernels.linearized_softmax_gdn.triton_op", "linearized_softmax_gdn_triton"),
    "mesa": ("kernels.mesa.triton_op", "mesa_triton"),
    "step": ("kernels.common.triton.step", "fused_step"),
}


@contextlib.contextmanager
def triton_ran(op: str, calls: int = 1) -> Iterator[mock.MagicMock]:
    """Within the block, count the calls of `op`'s Triton entry point (TRITON_ENTRIES; the
    function still runs) and, when the block ends without an error, assert there were
    `calls` of them. Yields the wrapper."""
    module_name, name = TRITON_ENTRIES[op]
    module = importlib.import_module(module_name)
    with mock.patch.object(module, name, wraps=getattr(module, name)) as entry:
        yield entry
    assert entry.call_count == calls, (
        f"{op}: the Triton entry point {module_name}.{name} ran {entry.call_count} times, expected {calls}")
