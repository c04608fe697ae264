"""Markdown table of the kernels task's records: per op (and gate variant), our time over the
peer's at each sequence length, forward and forward+backward, for one head shape. Ours is the
backend `auto` ran (the record's primary backend: Triton for the linear-time ops, the fastest
FlashAttention for softmax); the peer is FLA's kernel, and for softmax, which FLA does not
have, SDPA (the torch backend).

    python -m benchmarks.kernels_table [--results results] [--device cuda] [--heads 16x128]
    python -m benchmarks.kernels_table --device cpu --heads 4x64 --peer reference   # configs/kernels-cpu.yaml
    python -m benchmarks.kernels_table --breakdown 8192 [--phase fwd]   # records with profile=N

A cell is `ratio (ours ms)` where the peer ran beside ours in the same record, `ours ms` where
it did not (the last column says why: FLA missing, or refusing a backward on this Triton), "·"
where the record has no such point. Records of launch-setting variants (a `launch` override in
their config) are left out, and so are records that asked for no peer (`compare=[]`: ours
alone, the defaults a candidates sweep reads its variants against). When an op has several
records, the newest counts; the table's header names the records' devices, commits and
versions."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.records import RunRecord, device_type_of, newest_ok

# The peer of an op that FLA has no kernel for.
PEER_BESIDE_FLA = {"softmax_attention": "torch"}


def _peer(op: str, peer_name: str) -> str:
    """The backend an op's times are held to: FLA's kernel (or PEER_BESIDE_FLA's) for "fla"."""
    return PEER_BESIDE_FLA.get(op, "fla") if peer_name == "fla" else peer_name


def _points(record: RunRecord, heads: tuple[int, int]) -> dict[tuple[int, str, str], dict]:
    """(T, phase, backend) -> point of one record, for the head shape `heads` (H, K)."""
    out = {}
    for p in record.details.get("points", []):
        if (p["H"], p["K"]) == heads:
            out[(p["T"], p["phase"], p["backend"])] = p
    return out


def _cell(points: dict, T: int, phase: str, ours_name: str, peer_name: str) -> str:
    ours = points.get((T, phase, ours_name))
    if ours is None or ours["status"] != "ok":
        return "·" if ours is None else f"ours {ours['status']}"
    peer = points.get((T, phase, peer_name))
    if peer is not None and peer["status"] == "ok":
        return f"{ours['ms'] / peer['ms']:.2f} ({ours['ms']:.2f} ms)"
    return f"{ours['ms']:.2f} ms" + ("" if peer is None else f" ({peer_name} {peer['status']})")


def _short_device(name: str) -> str:
    """A record's device name for a table cell: 'NVIDIA H100 80GB HBM3' -> 'H100'; a CPU's
    ('cpu: <model>') whole."""
    return name if name.startswith("cpu") else name.removeprefix("NVIDIA ").split(" ")[0]


def table(results: Path, device: str, heads: tuple[int, int], peer_name: str = "fla") -> str:
    """The markdown table of the newest records (module doc). Where its rows come from more than
    one device or Triton, a last column names each row's device and commit (and Triton)."""
    newest = _newest(results, device)
    if not newest:
        return f"no ok kernels records for device {device} under {results / 'runs'}"
    devices = sorted({r.device for r in newest.values()})
    tritons = {r.versions.get("triton") for r in newest.values()}
    per_row = len(devices) > 1 or len(tritons) > 1
    lengths = sorted({T for r in newest.values() for (T, _, _) in _points(r, heads)})
    head = " / ".join(f"T={T // 1024}k" if T >= 1024 else f"T={T}" for T in lengths)
    lines = [f"| op | ours / peer | fwd {head} | fwd+bwd {head} | peer |" + (" record |" if per_row else ""),
             "|---|---|---|---|---|" + ("---|" if per_row else "")]
    for (op, variant), rec in sorted(newest.items()):
        pts = _points(rec, heads)
        peer = _peer(op, peer_name)
        why = rec.details.get("backends", {}).get(peer, "not asked")
        cells = [" / ".join(_cell(pts, T, phase, rec.backend, peer) for T in lengths) for phase in ("fwd", "fwdbwd")]
        name = op if variant == "default" else f"{op} ({variant})"
        label = f"{rec.backend} / {'FLA' if peer == 'fla' else peer}" if why == "ok" else rec.backend
        row = f"| {name} | {label} | {cells[0]} | {cells[1]} | {'same process' if why == 'ok' else why} |"
        if per_row:
            triton = f", Triton {rec.versions.get('triton')}" if len(tritons) > 1 else ""
            row += f" {_short_device(rec.device)}, {rec.git_commit[:7]}{triton} |"
        lines.append(row)
    commits = sorted({r.git_commit[:7] for r in newest.values()})
    versions = sorted({", ".join(f"{k} {v}" for k, v in sorted(r.versions.items())
                                 if k in ("torch", "triton", "fla") and v) for r in newest.values()})
    lines.append("")
    peer_note = " (torch: SDPA)" if peer_name == "fla" else ""
    lines.append(f"H = {heads[0]}, K = V = {heads[1]}; ours / peer time{peer_note}; {'; '.join(devices)}; "
                 f"commits {', '.join(commits)}; {'; '.join(versions)}")
    return "\n".join(lines)


def _newest(results: Path, device: str) -> dict[tuple[str, str], RunRecord]:
    """(op, input variant) -> its newest ok kernels record on device type `device` that times
    the op's defaults beside a peer: not a launch-setting variant (configs/kernels-launch*.yaml)
    and not ours alone (a candidates sweep's baseline, no ratio to give)."""
    return newest_ok(results, key=lambda rec: (rec.details["op"], rec.details.get("variant") or "default"),
                     keep=lambda rec: (rec.task == "kernels" and device_type_of(rec.device) == device
                                       and not rec.config.get("launch") and rec.config.get("compare") != []))


def breakdown(results: Path, device: str, heads: tuple[int, int], T: int, phase: str, peer_name: str = "fla") -> str:
    """Per op, the kernels of ours and of the peer at one point (length T, `phase`), from the
    newest record whose points carry a `kernels` breakdown (the kernels task's `profile`)."""
    lines = []
    for (op, variant), rec in sorted(_newest(results, device).items()):
        pts = _points(rec, heads)
        peer = _peer(op, peer_name)
        for column in dict.fromkeys((rec.backend, peer)):
            p = pts.get((T, phase, column))
            if not p or "kernels" not in p:
                continue
            total = sum(r["us_per_call"] for r in p["kernels"])
            lines.append(f"{op}{'' if variant == 'default' else f' ({variant})'} · {column} · {phase} T={T}: "
                         f"{p['ms']:.3f} ms timed; the top kernels sum to {total / 1e3:.3f} ms")
            lines += [f"    {r['us_per_call']:9.1f} us  x{r['launches_per_call']:g}  {r['name'][:90]}" for r in p["kernels"]]
    return "\n".join(lines) or f"no kernels breakdown at T={T} {phase} (run the kernels task with profile=N)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--device", default="cuda", help="device type of the records (cuda or cpu)")
    p.add_argument("--heads", default="16x128", help="head shape HxK of the points to show")
    p.add_argument("--peer", default="fla", help="the backend ours is held to: fla (softmax: SDPA) or one of the op's")
    p.add_argument("--breakdown", type=int, metavar="T", help="instead: the kernels of each op at length T")
    p.add_argument("--phase", default="fwdbwd", choices=["fwd", "fwdbwd"], help="the phase of --breakdown")
    args = p.parse_args()
    try:
        H, K = (int(x) for x in args.heads.lower().split("x"))
    except ValueError:
        p.error(f"--heads takes HxK, e.g. 16x128 or 32x64; got {args.heads!r}")
    if args.breakdown:
        print(breakdown(args.results, args.device, (H, K), args.breakdown, args.phase, args.peer))
    else:
        print(table(args.results, args.device, (H, K), args.peer))


if __name__ == "__main__":
    main()
