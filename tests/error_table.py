"""The tolerance of every kernel test and the largest error measured under it.

    python -m tests.error_table [--jobs 2] [--out results/findings/kernel_test_errors_cpu.json] [PYTEST_ARGS ...]

Runs the kernel tests (tests/kernels and tests/mixers by default; not the sm_90 compile
check, which measures no error) with KERNEL_ERRORS_JSON set, so that tests/util.py records
every rel_err and row_err with the bound each is compared against (tests/conftest.py merges
the xdist workers' records). Writes, per test file, dtype of the compared tensor, metric and
bound: the largest error, the test that measured it and how many tests share that bound;
beside it each test's own records, and the errors no test compares with a fixed bound
directly (a lower bound, or a bound derived from another error). Prints the summary as a
markdown table; exits with pytest's status.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.json_record import save_text

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TESTS = ["tests/kernels", "tests/mixers", "--ignore=tests/kernels/test_compile_sm90.py"]
DEFAULT_OUT = "results/findings/kernel_test_errors_cpu.json"
DTYPE_ORDER = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}


def run_tests(pytest_args: list[str], jobs: int, records_path: Path) -> tuple[int, str, float]:
    """Run pytest with the error records on; return (exit status, its summary line, wall s)."""
    env = {**os.environ, "KERNEL_ERRORS_JSON": str(records_path)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(jobs), *pytest_args]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    for line in failed:
        print(line)
    return done.returncode, (lines[-1] if lines else "").strip("= "), wall


def summarise(records: list[list]) -> tuple[list[dict], list[dict], dict[str, list]]:
    """From rows [test, metric, dtype, bound or None, error]: the summary rows per (file,
    dtype, metric, bound), the indirect errors, and each test's bounded records."""
    bounded: dict[tuple, list[tuple[float, str]]] = defaultdict(list)
    per_test: dict[str, list] = defaultdict(list)
    largest_bounded: dict[tuple, float] = {}
    computed: dict[tuple, float] = {}
    for test, metric, dtype, bound, err in records:
        if bound is None:
            computed[(test, metric, dtype)] = err
            continue
        file = test.split("::", 1)[0]
        bounded[(file, dtype, metric, bound)].append((err, test))
        per_test[test].append([metric, dtype, bound, err])
        key = (test, metric, dtype)
        largest_bounded[key] = max(largest_bounded.get(key, 0.0), err)
    rows = []
    for (file, dtype, metric, bound), found in bounded.items():
        err, test = max(found)
        rows.append({"file": file, "dtype": dtype, "metric": metric, "bound": bound, "largest_error": err,
                     "margin": bound / err if err > 0 else None, "tests": len({t for _, t in found}),
                     "measured_by": test.split("::", 1)[1]})
    rows.sort(key=lambda r: (r["file"], DTYPE_ORDER.get(r["dtype"], 9), r["metric"], r["bound"]))
    # an error larger than anything its test held to a fixed bound was compared some other way
    indirect = [{"test": test, "metric": metric, "dtype": dtype, "largest_error": err,
                 "largest_directly_bounded": largest_bounded.get((test, metric, dtype))}
                for (test, metric, dtype), err in computed.items()
                if err > largest_bounded.get((test, metric, dtype), -1.0)]
    indirect.sort(key=lambda r: (r["test"], r["metric"], r["dtype"]))
    for entries in per_test.values():
        entries.sort(key=lambda e: (e[0], DTYPE_ORDER.get(e[1], 9), e[2]))
    return rows, indirect, dict(sorted(per_test.items()))


def markdown(rows: list[dict]) -> str:
    """The summary rows as a markdown table."""
    out = ["| test file | dtype | metric | bound | largest error | bound / error | tests | measured by |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        margin = f"{r['margin']:.3g}" if r["margin"] is not None else "-"
        out.append(f"| {r['file'].removeprefix('tests/')} | {r['dtype']} | {r['metric']} | {r['bound']:.3g} | "
                   f"{r['largest_error']:.2e} | {margin} | {r['tests']} | `{r['measured_by']}` |")
    return "\n".join(out)


def versions() -> dict[str, str]:
    import hypothesis
    import torch

    found = {"python": sys.version.split()[0], "torch": torch.__version__, "hypothesis": hypothesis.__version__}
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError:
        found["triton"] = "not installed"
    return found


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True)
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def write_json(path: Path, record: dict) -> None:
    """The record with one line per summary row and per test, so that it diffs by row."""
    lines = ["{"]
    items = list(record.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value:
            body = ",\n".join("  " + json.dumps(v) for v in value)
            lines.append(f"{json.dumps(key)}: [\n{body}\n]{comma}")
        elif isinstance(value, dict) and value and key == "tests":
            body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{json.dumps(key)}: {{\n{body}\n}}{comma}")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    save_text("\n".join(lines) + "\n", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="xdist workers (default 2)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"the JSON record (default {DEFAULT_OUT})")
    parser.add_argument("--machine", default="2 CPU cores, no GPU", help="what the tests ran on, for the record")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = pytest_args or DEFAULT_TESTS
    with tempfile.TemporaryDirectory() as tmp:
        records_path = Path(tmp) / "errors.json"
        status, summary, wall = run_tests(pytest_args, args.jobs, records_path)
        if not records_path.exists():
            print(f"pytest wrote no error records (exit {status}): {summary}", file=sys.stderr)
            return status or 1
        records = json.loads(records_path.read_text())["records"]
    rows, indirect, per_test = summarise(records)
    record = {
        "what": "tolerance of every kernel test (the bound each rel_err / row_err is compared with) and the "
                "largest error measured under it; python -m tests.error_table",
        "date": datetime.date.today().isoformat(),
        "machine": args.machine,
        "versions": versions(),
        "commit": commit(),
        "pytest_args": pytest_args,
        "pytest": {"exit_status": status, "summary": summary, "wall_s": round(wall, 1), "workers": args.jobs},
        "rows": rows,
        "indirect": indirect,
        "tests": per_test,
    }
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, record)
    print(markdown(rows))
    print(f"\n{summary} in {wall:.0f} s; {len(per_test)} tests with bounded errors; written to {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
