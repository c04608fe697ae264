"""Compile every Triton kernel the ops launch for Hopper (sm_90) on a machine without a GPU.

The CPU interpreter runs the kernels' Python, not Triton's compiler, so a kernel that the
installed Triton cannot compile passes every interpreter test (it happened: a constexpr
`axis=None` that Triton 3.6 compiled and 3.9 does not). Here JITFunction.run is replaced by
a compile-only stand-in: each launch's arguments give the kernel's signature and constexprs,
and triton.compile builds PTX for sm_90 from them; nothing runs, the outputs are garbage.
Each op runs forward and backward once at K = V = 128 (the GPU tiles) in bf16, then again
with each launch option that is off by default; the delta rules also run their forward with
no gradient wanted (the inference kernels), fused and not.

    python tests/compile_sm90.py          # TRITON_INTERPRET must be unset; exit 1 on a failure
    python tests/compile_sm90.py --resources   # also registers and spill stack of each kernel

--resources reads them from the cubin with the cuobjdump that ships in Triton's wheel: a
way to screen launch variants for register spills without a GPU (this Triton's codegen, which
may differ from the device's: on MesaNet's CG kernels it spilled more, in the same order).

tests/kernels/test_compile_sm90.py runs it in a process of its own.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POINTER_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
                 "int32": "i32", "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "i1"}


def launch_signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, options) of one launch of JITFunction `fn`."""
    import torch

    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    values = dict(zip(fn.arg_names, args))
    values.update(kwargs)
    signature, constexprs = {}, {}
    for param in fn.params:
        name = param.name
        if name not in values:
            if not param.has_default:
                raise TypeError(f"{fn.__name__}: argument {name} missing")
            values[name] = param.default
        value = values[name]
        if param.is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + POINTER_TYPES[str(value.dtype).removeprefix("torch.")]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value is None:
            signature[name], constexprs[name] = "constexpr", None
        else:
            raise TypeError(f"{fn.__name__}: argument {name} of type {type(value).__name__}")
    return signature, constexprs, options


def resource_usage(cubin: bytes) -> str:
    """"REG:n STACK:n SHARED:n LOCAL:n" of a cubin's kernel, from cuobjdump (Triton's copy)."""
    import re
    import subprocess
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=False).stdout
    found = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", out)
    return found.group(0) if found else "resource usage unavailable"


class CompileOnly:
    """Stands in for JITFunction.run: compiles each distinct launch for sm_90, runs nothing."""

    def __init__(self, resources: bool = False):
        self.resources = resources
        self.done: dict[tuple, float] = {}
        self.usage: dict[tuple, str] = {}
        self.failed: dict[tuple, str] = {}

    def __call__(self, fn, *args, grid=None, warmup=False, **kwargs):
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        signature, constexprs, options = launch_signature(fn, args, dict(kwargs))
        key = (fn.__name__, tuple(sorted((k, repr(v)) for k, v in constexprs.items())),
               tuple(sorted(signature.items())), tuple(sorted(options.items())))
        if key in self.done or key in self.failed:
            return
        started = time.time()
        try:
            compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", 90, 32), options=options)
            self.done[key] = time.time() - started
            if self.resources:
                self.usage[key] = resource_usage(compiled.asm["cubin"])
        except Exception as e:  # noqa: BLE001 - every failure is reported, the rest still compiled
            self.failed[key] = f"{type(e).__name__}: {str(e)[-600:]}"
        return


def _leaves(args: dict) -> list:
    """Make every floating tensor of args (also inside a state tuple) a leaf that wants its
    gradient; return them."""
    import torch

    found = []
    for value in args.values():
        for t in value if isinstance(value, tuple) else (value,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                found.append(t.requires_grad_(True))
    return found


def training_step(op: str, variant: str | None, head_dim: int, device: str = "cpu", dtype: str = "bf16",
                  value_dim: int | None = None, batch: int = 1, seq_len: int = 200):
    """A zero-argument forward and backward of `op`'s Triton entry point, as one training step
    runs it: its input factory's tensors (B `batch`, T `seq_len`, H 2, K = head_dim,
    V = value_dim or head_dim, `dtype` "bf16" or "fp32", input `variant`, no state) on
    `device`, every floating input wanting its gradient. fp32 dots follow
    torch.get_float32_matmul_precision at launch (kernels.common.triton.utils.dot_precision)."""
    import torch

    from kernels.common.spec import load_entry
    from kernels.registry import SPECS

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if dtype not in dtypes:
        raise ValueError(f"dtype {dtype!r}: valid are {sorted(dtypes)}")
    spec = SPECS[op]
    entry = load_entry(spec.backends["triton"].entry)
    args = spec.make_inputs(batch, seq_len, 2, head_dim, value_dim or head_dim, variant=variant,
                            dtype=dtypes[dtype], device=device)
    _leaves(args)

    def step() -> None:
        o, _ = entry(**args, scale=head_dim**-0.5, output_final_state=False)
        o.backward(torch.ones_like(o))

    return step


def spec_calls() -> dict:
    """label -> a call of the Triton entry point of every op that has one (kernels.registry),
    on its input factory's tensors at K = V = 128 in bf16 (the GPU tiles): each input variant
    without a state, then with an initial state and a loss on the final state too, so the
    backward takes the state paths. Returns o (depending on every final-state tensor)."""
    import torch

    from kernels.common.spec import load_entry
    from kernels.registry import SPECS

    B, T, H, D = 1, 200, 2, 128
    calls = {}
    for spec in SPECS.values():
        if "triton" not in spec.backends:
            continue
        entry = load_entry(spec.backends["triton"].entry)
        for variant in spec.variants:
            label = spec.name if len(spec.variants) == 1 else f"{spec.name}[{variant}]"
            for state in (False, True):
                args = spec.make_inputs(B, T, H, D, D, variant=variant, dtype=torch.bfloat16, state=state)
                _leaves(args)

                def call(entry=entry, args=args, state=state):
                    o, final = entry(**args, scale=D**-0.5, output_final_state=state)
                    tensors = [t for t in (final if isinstance(final, tuple) else (final,)) if torch.is_tensor(t)]
                    return o + sum(t.sum() for t in tensors).to(o.dtype) if tensors else o

                calls[label + (" with a state" if state else "")] = call
    return calls


def run_ops() -> None:
    """Forward and backward of every op's Triton entry point (and the decode steps)."""
    import torch

    def backward(o):
        o.backward(torch.ones_like(o))

    calls = spec_calls()
    for name, call in calls.items():
        print(f"compile_sm90: {name}", flush=True)
        backward(call())
    # the options that are off by default, each on the ops that use it
    from kernels.common.launch import launch_settings

    gla = "gated_linear_attention"
    fused_delta = {"fused_fwd": {"enabled": True, "min_heads": 1}}
    options = [  # (label, the launch_settings overrides, the ops that use it)
        ("one backward launch, 16-row sub-chunks", {gla: {"bwd_dqkg": {"split_paths": False, "sub_chunk": 16}}},
         ["gated_linear_attention[vector]"]),
        ("vector segments", {gla: {"fwd_fused_vector": {"segment_programs": 1056}}}, ["gated_linear_attention[vector]"]),
        ("the fused forward at three stages (narrow_num_stages, here up to K = 128)",
         {gla: {"fwd_fused_scalar": {"min_heads": 1, "narrow_num_stages": 3, "narrow_max_K": 128}},
          "linear_attention": {"fwd_fused": {"min_heads": 1, "narrow_num_stages": 3, "narrow_max_K": 128}}},
         ["gated_linear_attention[scalar]", "linear_attention"]),
        ("the scalar gate's decay on the value rows, one pass",
         {gla: {"fwd_fused_scalar": {"min_heads": 1, "decay_on_v": True}}}, ["gated_linear_attention[scalar]"]),
        ("the scalar gate's decay on the value rows, in segments",
         {gla: {"fwd_fused_scalar": {"min_heads": 10**6, "segment_programs": 1024, "decay_on_v": True}}},
         ["gated_linear_attention[scalar]"]),
        ("dv in the dq/dk kernel (one 128-key block, 8 warps)",
         {op: {"bwd_dqk": {"fuse_dv": True, "BK": 128, "num_warps": 8}} for op in (gla, "linear_attention")},
         ["gated_linear_attention[scalar]", "linear_attention"]),
        ("16-row sub-chunks (forward)", {gla: {"intra_A": {"sub_chunk": 16}}}, ["gated_linear_attention[vector]"]),
        *[(f"{entry} inter_after", {gla: {entry: {"inter_after": True}}}, ["gated_linear_attention[vector]"])
          for entry in ("bwd_dqkg", "bwd_dqkg_sub", "bwd_dqkg_exact")],
        ("fused delta forward", {"delta_rule": fused_delta, "gated_delta_rule": fused_delta},
         ["delta_rule", "gated_delta_rule"]),
        ("dU_local in its own launch", {op: {"state_bwd": {"local_du": False}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        ("the WY backward forming dM^T from transposed products",
         {op: {"wy_bwd": {"dm_readback": False}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        ("dk's share from dqkw in fp32 (the defaults store it in 16 bits)",
         {op: {"dqkw": {"dk_part_16bit": False}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        ("the backward state pass's row factors where the op's default does not put them (DeltaNet: on the V "
         "side, GDN: on q and k)",
         {"delta_rule": {"state_bwd": {"factors_on_v": True, "local_du": False}},
          "gated_delta_rule": {"state_bwd": {"factors_on_v": False}}},
         ["delta_rule", "gated_delta_rule"]),
        ("dU_local in the backward state pass at K = 128",
         {"gated_delta_rule": {"state_bwd": {"local_du": True, "min_heads": 1, "max_K": 256}}}, ["gated_delta_rule"]),
        *[(f"cg_operands={operands}", {"mesa": {"fwd_solve": {"operands": operands}, "bwd_solve": {"operands": operands}}},
           ["mesa"]) for operands in ("fp32", "fp16_normed")],
        ("gradients at 8 warps over the whole K", {"mesa": {"grads": {"num_warps": 8, "BC": 256}}},
         ["mesa", "mesa with a state"]),
        ("mesa state passes 128 x 32, 8 warps, 3 stages",
         {"mesa": {"states": {"max_BK": 128, "max_BD": 32, "num_warps": 8, "num_stages": 3}}}, ["mesa"]),
        ("the running-mean scans by tl.cumsum",
         {"linearized_softmax_gdn": {"prep": {"fwd_by_dot": False, "bwd_by_dot": False}}}, ["linearized_softmax_gdn"]),
        ("the running-mean scans in 64-row segments (T = 200: four)",
         {"linearized_softmax_gdn": {"prep": {"segment_rows": 64}}},
         ["linearized_softmax_gdn", "linearized_softmax_gdn with a state"]),
        ("the backward state pass at three stages (DeltaNet's where its programs are few)",
         {op: {"state_bwd": {"num_stages": 3}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        *[(f"sums on the tensor cores, {how}",
           {"linearized_softmax_gdn": {"mean_form": "dots", "train_fused_max_K": 128},
            "gated_delta_rule": {"fused_fwd": {"enabled": fused, "min_heads": 1}}},
           ["linearized_softmax_gdn", "linearized_softmax_gdn with a state"])
          for how, fused in (("fused training pass", True), ("two kernels", False))],
        ("the running mean stored whole by the scan", {"linearized_softmax_gdn": {"mean_form": "stored"}},
         ["linearized_softmax_gdn", "linearized_softmax_gdn with a state"]),
        ("dqkw over 32-column V-blocks (narrow_BV, here up to K = 128)",
         {op: {"dqkw": {"narrow_BV": 32, "narrow_max_K": 128}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        ("dqkw with one program a chunk walking the K-blocks (k_loop), 64-column V-blocks",
         {op: {"dqkw": {"k_loop": True, "BV": 64}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        ("dqkw and the WY backward as one kernel (fuse_wy_bwd)",
         {op: {"dqkw": {"fuse_wy_bwd": True}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        ("dqkw and the WY backward as one kernel, its dqkw half over 32-key blocks",
         {"gated_delta_rule": {"dqkw": {"fuse_wy_bwd": True, "BK": 32}}}, ["gated_delta_rule"]),
        *[(f"P stored by the forward ({how}), read by the backward state pass at K = 128",
           {op: {"store_p": True, "fused_fwd": {"enabled": fused, "min_heads": 1},
                 "state_bwd": {"local_du": True, "min_heads": 1, "max_K": 256}} for op in ("delta_rule", "gated_delta_rule")},
           ["delta_rule", "gated_delta_rule", "linearized_softmax_gdn"])
          for how, fused in (("fused", True), ("output_fwd", False))],
        *[(f"P formed by wy_fwd, read by the output ({how}) and the backward state pass",
           {op: {"p_in_wy": True, "fused_fwd": {"enabled": fused, "min_heads": 1},
                 "state_bwd": {"local_du": True, "min_heads": 1, "max_K": 256}} for op in ("delta_rule", "gated_delta_rule")},
           ["delta_rule", "gated_delta_rule", "linearized_softmax_gdn"])
          for how, fused in (("fused", True), ("output_fwd", False))],
        ("P stored by the forward, read by du_local",
         {op: {"store_p": True, "state_bwd": {"local_du": False}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
        ("the heads first on the grid, dU_local in its own launch",
         {op: {"heads_first": True, "state_bwd": {"local_du": False}} for op in ("delta_rule", "gated_delta_rule")},
         ["delta_rule", "gated_delta_rule"]),
    ]
    for label, over, names in options:
        with launch_settings(**over):
            for name in names:
                print(f"compile_sm90: {name} with {label}", flush=True)
                backward(calls[name]())
    # the forwards where no gradient is wanted (inference): the delta rules' state pass with
    # the output fused (infer_fused; on from 32 sequences of heads, forced on here), also at
    # the three stages it takes on a GPU where its programs are few (no multiprocessors here),
    # and not fused
    fused_infer = {"infer_fused": {"enabled": True, "min_heads": 1}}
    deep_infer = {"infer_fused": {"enabled": True, "min_heads": 1, "num_stages": 3}}
    delta_names = [n for n in calls if n.split(" ")[0] in ("delta_rule", "gated_delta_rule", "linearized_softmax_gdn")]
    dot_mean = {"linearized_softmax_gdn": {"mean_form": "dots"}}
    acc_mean = {"linearized_softmax_gdn": {"mean_form": "dots", "mean_in_acc": "always"}}
    stored_mean = {"linearized_softmax_gdn": {"mean_form": "stored"}}
    for label, over in (("fused", {"delta_rule": fused_infer, "gated_delta_rule": fused_infer}),
                        ("fused, three stages", {"delta_rule": deep_infer, "gated_delta_rule": deep_infer}),
                        ("two kernels", {}),
                        ("fused, lin_gdn's mean summed on the tensor cores",
                         {"delta_rule": fused_infer, "gated_delta_rule": fused_infer, **dot_mean}),
                        ("fused, lin_gdn's mean summed into the output's tile (its pass within one wave)",
                         {"delta_rule": fused_infer, "gated_delta_rule": fused_infer, **acc_mean}),
                        ("fused, lin_gdn's mean stored whole by the scan",
                         {"delta_rule": fused_infer, "gated_delta_rule": fused_infer, **stored_mean}),
                        ("two kernels, lin_gdn's mean summed on the tensor cores", dot_mean)):
        with launch_settings(**over), torch.no_grad():
            for name in delta_names:
                print(f"compile_sm90: {name} without a gradient, {label}", flush=True)
                calls[name]()
    # the fused one-token decode step: every gate kind, with and without the delta rule
    from kernels.common.triton.step import fused_step

    H, D, bf16 = 2, 128, torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        q1, k1, v1 = (torch.randn(2, H, D, generator=gen).to(bf16) for _ in range(3))
        state = torch.zeros(2, H, D, D)
        beta1 = torch.rand(2, H, generator=gen).to(bf16)
        for g1 in (None, -torch.rand(2, H, generator=gen), -torch.rand(2, H, D, generator=gen)):
            for b1 in (None, beta1):
                if b1 is not None and g1 is not None and g1.dim() == 3:
                    continue  # no delta rule with a vector gate
                print(f"compile_sm90: decode step gate={None if g1 is None else tuple(g1.shape)} "
                      f"delta={b1 is not None}", flush=True)
                fused_step(q1, k1, v1, g1, b1, state, D**-0.5)
                fused_step(q1, k1, v1, g1, b1, None, D**-0.5)


def main() -> int:
    if os.environ.get("TRITON_INTERPRET"):
        print("compile_sm90: unset TRITON_INTERPRET (the interpreter never compiles)", file=sys.stderr)
        return 2
    from triton.runtime.jit import JITFunction

    from kernels.common.triton import utils

    stand_in = CompileOnly(resources="--resources" in sys.argv[1:])
    JITFunction.run = lambda self, *args, **kwargs: stand_in(self, *args, **kwargs)
    # the launches are for a GPU, whose tl.dot multiplies bf16 (the CPU tensors here would
    # otherwise send the kernels that split fp32 into bf16 parts down their fp32 path)
    utils.bf16_products = lambda device: True
    try:
        run_ops()
    except Exception:  # noqa: BLE001 - a host-side failure after a compile failure is reported below
        traceback.print_exc()
        if not stand_in.failed:
            return 1
    for key, seconds in sorted(stand_in.done.items()):
        usage = f" {stand_in.usage[key]}" if key in stand_in.usage else ""
        print(f"ok   {key[0]} {dict(key[1])} {dict(key[3])} ({seconds:.1f} s){usage}")
    for key, error in stand_in.failed.items():
        print(f"FAIL {key[0]} {dict(key[1])} {dict(key[3])}: {error}")
    print(f"compile_sm90: {len(stand_in.done)} launches compiled, {len(stand_in.failed)} failed")
    return 1 if stand_in.failed else 0


if __name__ == "__main__":
    sys.exit(main())
