"""Mutation check of the Triton kernels' block offsets: does a CPU test fail when a kernel reads
the first block instead of its own?

Each mutant changes one `i_k * BK` or `i_v * BV` in kernels/ to `0 * BK` / `0 * BV`, then runs
the multi-block tests of the ops that use that file (tests/kernels/triton/test_multi_block.py,
under TRITON_INTERPRET=1) in a copy of the tree; the mutant is killed when a test fails.

    python -m tests.mutation_check [--jobs 2] [--only kernels/common] [--out FILE.json]

Exits 1 when a mutant survives. A kernel file no multi-block test covers is listed as not
covered rather than run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.json_record import save_text

REPO = Path(__file__).resolve().parents[1]
OFFSET = re.compile(r"\bi_([kv]) \* B([KV])\b")
TESTS = "tests/kernels/triton/test_multi_block.py"
# Which multi-block tests exercise a kernel file (pytest -k expressions).
COVERAGE = {
    "kernels/common/triton/": "linear_attention or gated_linear_attention",
    "kernels/gated_linear_attention/": "gated_linear_attention",
    # the chunk pipeline linear attention shares with GLA
    **{f"kernels/gated_linear_attention/triton_{m}.py": "linear_attention or gated_linear_attention"
       for m in ("states", "output", "grad_qk", "fused_forward", "segments")},
    "kernels/gated_delta_rule/": "delta_rules",
    "kernels/mesa/": "mesa",
    "kernels/common/triton/step.py": "decode_step",
}


@dataclass
class Mutant:
    file: str
    line: int
    text: str
    killed: bool | None = None  # None: not run (no multi-block test covers the file)
    seconds: float = 0.0
    failed_test: str = ""


def find_mutants(only: str | None) -> list[Mutant]:
    out = []
    for path in sorted((REPO / "kernels").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if only and not rel.startswith(only):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for _ in OFFSET.finditer(line):
                out.append(Mutant(rel, n, line.strip()))
                break  # one mutant per line: the line's first offset
    return out


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv", "results", "__pycache__", ".hypothesis", "wandb", ".whl",
                                    ".resume-carry", "*.egg-info")
    shutil.copytree(REPO, dest, ignore=ignore, dirs_exist_ok=True)


def run_mutant(mutant: Mutant, tree: Path) -> Mutant:
    # the most specific prefix that matches (step.py before kernels/common/triton/)
    prefixes = sorted((p for p in COVERAGE if mutant.file.startswith(p)), key=len, reverse=True)
    if not prefixes:
        return mutant
    covered = COVERAGE[prefixes[0]]
    path = tree / mutant.file
    original = path.read_text()
    lines = original.splitlines(keepends=True)
    lines[mutant.line - 1] = OFFSET.sub(lambda m: f"0 * B{m.group(2)}", lines[mutant.line - 1], count=1)
    path.write_text("".join(lines))
    start = time.perf_counter()
    try:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", TESTS, "-k", covered],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=900)
        mutant.killed = done.returncode != 0
        failed = [ln for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
        mutant.failed_test = failed[0] if failed else ""
    finally:
        path.write_text(original)
        mutant.seconds = time.perf_counter() - start
    return mutant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default=None, help="only kernel files under this path, e.g. kernels/common")
    parser.add_argument("--out", default=None, help="write every mutant's result to this JSON file")
    args = parser.parse_args()
    mutants = find_mutants(args.only)
    with tempfile.TemporaryDirectory() as tmp:
        trees = [Path(tmp) / f"tree{i}" for i in range(args.jobs)]
        for tree in trees:
            _copy_tree(tree)
        free = list(trees)

        def one(m: Mutant) -> Mutant:
            tree = free.pop()
            try:
                return run_mutant(m, tree)
            finally:
                free.append(tree)

        with ThreadPoolExecutor(args.jobs) as pool:
            results = []
            for m in pool.map(one, mutants):
                results.append(m)
                state = {True: "killed", False: "SURVIVED", None: "not covered"}[m.killed]
                print(f"{state:11s} {m.file}:{m.line} ({m.seconds:.0f} s)  {m.text[:70]}", flush=True)
    survived = [m for m in results if m.killed is False]
    uncovered = [m for m in results if m.killed is None]
    print(f"{len(results)} mutants: {sum(m.killed is True for m in results)} killed, {len(survived)} survived, "
          f"{len(uncovered)} not covered")
    if args.out:
        save_text(json.dumps({"what": __doc__.splitlines()[0], "mutants": [asdict(m) for m in results]}, indent=1),
                  args.out)
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
