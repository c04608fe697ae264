"""Peak memory of one call above its inputs, for a series of probes (mode, T).

On CUDA it is measured in process: torch.cuda.max_memory_allocated() during the call minus
torch.cuda.memory_allocated() once the inputs exist (after a warm-up call of the same shape,
so Triton's compilation and autotuning are not counted).

On the CPU torch keeps no allocation statistics, so a child process (multiprocessing's
fork server, else spawn) runs the probes and reads the operating system's count of its resident memory:
the peak resident set during the call minus the resident set once the inputs exist. glibc
is told to serve every block of 64 KiB or more by mmap (MALLOC_MMAP_THRESHOLD_), so freed
tensors go back to the system and the next probe starts clean; the peak is reset between
probes through /proc/self/clear_refs. Where that reset is refused, the child measures one
probe with ru_maxrss (the peak since it started, less the peak after setup) and the next
probe gets a fresh child. A memory cap (`max_bytes`) is enforced with RLIMIT_AS, so an
allocation past it fails inside torch like a real out-of-memory.

An out-of-memory is a result, not a crash: the probe is recorded as "oom" and larger T of
the same mode are skipped. A probe that raises is "failed" with its error; a child that
dies or runs past `timeout_s` fails its probe and the next probes go to a new child.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch

from tasks.common.faults import describe, free_memory, is_oom
from tasks.common.workloads import LayerSpec, build_layer, make_call

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Probe:
    mode: str
    T: int


class Workload(Protocol):
    """A picklable description of what to measure: built once per process, then called per probe."""

    def setup(self, device: torch.device) -> Any: ...
    def call(self, state: Any, probe: Probe) -> Callable[[], Any]: ...


@dataclass(frozen=True)
class MixerFwdBwd:
    """Forward+backward of a registered mixer at op or layer level (probe.mode), batch B."""

    mixer: str
    spec: LayerSpec
    B: int
    seed: int

    def setup(self, device):
        return build_layer(self.mixer, self.spec, device, self.seed)

    def call(self, state, probe):
        return make_call(state, probe.mode, "fwdbwd", self.B, probe.T)


def cache_bytes(obj: Any) -> int:
    """Bytes of every tensor in a (nested) decode cache: tensors, tuples, NamedTuples, lists, dicts."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(cache_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(cache_bytes(o) for o in obj.values())
    return 0


@dataclass(frozen=True)
class MixerPrefillState:
    """A prefill of one sequence of probe.T tokens; the call returns the bytes of the decode
    cache it leaves (a result's `value`), measured under the same caps as the other probes."""

    mixer: str
    spec: LayerSpec
    seed: int

    def setup(self, device):
        return build_layer(self.mixer, self.spec, device, self.seed)

    def call(self, state, probe):
        x = torch.randn(1, probe.T, state.d_model, device=next(state.parameters()).device, dtype=self.spec.dtype)

        def prefill() -> int:
            with torch.no_grad():
                _, cache = state.prefill(x)
            return cache_bytes(cache)

        return prefill


def peak_memory(workload: Workload, probes: list[Probe], device: torch.device, max_bytes: int | None = None,
                timeout_s: float = 600.0, threads: int | None = None, warmup_T: int = 16) -> list[dict]:
    """One result per probe: {mode, T, status ok|oom|failed|skipped, peak_bytes, error, method}."""
    device = torch.device(device)
    if device.type == "cuda":
        state = workload.setup(device)
        measure = partial(_cuda_peak, workload, state, device=device)
        return list(_run_probes(probes, measure, max_bytes, cleanup=partial(free_memory, device)))
    return _in_children(workload, probes, max_bytes, timeout_s, threads, warmup_T)


def _run_probes(probes: list[Probe], measure: Callable[[Probe], dict], max_bytes: int | None,
                stop_after_one: bool = False, oom_at: dict[str, int] | None = None,
                cleanup: Callable[[], None] | None = None):
    """Measure probes in order, skipping larger T of a mode once it ran out of memory (yields
    results); `oom_at` carries what earlier processes found; with stop_after_one, stop after
    the first probe really measured. cleanup() runs after each probe, once a failed probe's
    exception (and the tensors its traceback holds) is gone."""
    oom_at = dict(oom_at or {})
    for probe in probes:
        if probe.mode in oom_at and probe.T > oom_at[probe.mode]:
            yield _result(probe, "skipped", error=f"larger than T={oom_at[probe.mode]}, which ran out of memory")
            continue
        try:
            result = measure(probe)
        except Exception as e:  # noqa: BLE001 - a probe's fault is its result
            result = _result(probe, "oom" if is_oom(e) else "failed", error=describe(e))
        if cleanup is not None:
            cleanup()
        if result["status"] == "ok" and max_bytes is not None and result["peak_bytes"] > max_bytes:
            result.update(status="oom", error=f"peak {result['peak_bytes']} B is over the cap max_bytes={max_bytes}")
        if result["status"] == "oom":
            oom_at[probe.mode] = min(probe.T, oom_at.get(probe.mode, probe.T))
        yield result
        if stop_after_one:
            return


def _result(probe: Probe, status: str, peak: int | None = None, error: str | None = None, method: str = "",
            value: Any = None) -> dict:
    """A probe's result; `value` is what the call returned when it is a number (else left out)."""
    out = {"mode": probe.mode, "T": probe.T, "status": status, "peak_bytes": peak, "error": error, "method": method}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out["value"] = value
    return out


# -- CUDA ---------------------------------------------------------------------------------

def _cuda_peak(workload: Workload, state: Any, probe: Probe, *, device: torch.device) -> dict:
    call = workload.call(state, probe)
    call()  # warm-up: compilation and autotuning allocate too
    torch.cuda.synchronize(device)
    gc.collect()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    value = call()
    torch.cuda.synchronize(device)
    return _result(probe, "ok", torch.cuda.max_memory_allocated(device) - base,
                   method="torch.cuda.max_memory_allocated above the inputs", value=value)


# -- CPU: child processes -------------------------------------------------------------------

def _process_context():
    """Fresh processes for the probes. A fork server (a clean process started like spawn,
    with torch and the mixers imported once) forks each child in milliseconds where a plain
    spawn would import torch again; spawn where there is no fork server."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "mixers.builtin", "tasks.common.memprobe"])
    return ctx


def _in_children(workload, probes, max_bytes, timeout_s, threads, warmup_T) -> list[dict]:
    ctx = _process_context()
    results: list[dict] = []
    while len(results) < len(probes):
        oom_at = _oom_at(results)
        recv, send = ctx.Pipe(duplex=False)
        args = (send, workload, probes[len(results):], max_bytes, threads, warmup_T, oom_at)
        child = ctx.Process(target=_child_main, args=args, daemon=True)
        saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
        # Read by glibc when the process (the fork server, on first use) starts; forks inherit it.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        try:
            child.start()
        finally:
            if saved is None:
                del os.environ["MALLOC_MMAP_THRESHOLD_"]
            else:
                os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
        send.close()
        try:
            while len(results) < len(probes):
                if not recv.poll(timeout_s):
                    child.kill()
                    results.append(_result(probes[len(results)], "failed", error=f"timed out after {timeout_s:.0f} s"))
                    break
                message = recv.recv()
                if message is None:  # the child measured what it could; the rest go to a new one
                    break
                if "fatal" in message:
                    results += [_result(p, "failed", error=message["fatal"]) for p in probes[len(results):]]
                    break
                results.append(message)
        except EOFError:  # the child died mid-probe (a signal, the kernel's OOM killer)
            child.join(5)
            results.append(_result(probes[len(results)], "failed", error=f"child process died (exit code {child.exitcode})"))
        finally:
            child.join(5)
            if child.is_alive():
                child.kill()
            recv.close()
    return results


def _oom_at(results: list[dict]) -> dict[str, int]:
    """The smallest T per mode that ran out of memory so far."""
    out: dict[str, int] = {}
    for r in results:
        if r["status"] == "oom":
            out[r["mode"]] = min(r["T"], out.get(r["mode"], r["T"]))
    return out


def _child_main(conn, workload, probes, max_bytes, threads, warmup_T, oom_at) -> None:
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        state = workload.setup(torch.device("cpu"))
        # A small call of each mode first: thread pools, lazily built kernels and autograd's
        # first-use allocations are setup, not the probe's.
        for mode in dict.fromkeys(p.mode for p in probes):
            workload.call(state, Probe(mode, min(warmup_T, min(p.T for p in probes))))()
        _release()
        if max_bytes is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + max_bytes, hard))
        can_reset = _reset_peak()
        measure = partial(_cpu_peak, workload, state, can_reset=can_reset)
        probed = _run_probes(probes, measure, max_bytes, stop_after_one=not can_reset, oom_at=oom_at, cleanup=_release)
        for result in probed:
            conn.send(result)
        conn.send(None)
    except Exception as e:  # noqa: BLE001 - setup failed: every probe fails with its reason
        conn.send({"fatal": describe(e)})
    finally:
        conn.close()


def _cpu_peak(workload, state, probe: Probe, *, can_reset: bool) -> dict:
    call = workload.call(state, probe)  # the inputs: in the baseline
    _release()
    if can_reset:
        _reset_peak()
        base, method = _rss(), "peak RSS (VmHWM, reset per probe) above the inputs, child process"
    else:
        base, method = _max_rss(), "ru_maxrss above the peak after setup, one child per probe"
    value = call()
    peak = (_hwm() if can_reset else _max_rss()) - base
    return _result(probe, "ok", max(peak, 0), method=method, value=value)


def _release() -> None:
    """Free what Python holds and hand freed heap back to the system."""
    gc.collect()
    _malloc_trim()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _vm_size() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * _PAGE


def _hwm() -> int:
    return _status_kib("VmHWM")


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _reset_peak() -> bool:
    """Reset the peak resident set (Linux >= 4.0); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _hwm() <= _rss() + 16 * _PAGE
    except OSError:
        return False


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
