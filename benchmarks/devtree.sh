#!/usr/bin/env bash
# Build .devtree/ (git-ignored): a snapshot of a commit for the device tool to carry, so a GPU
# call runs committed code while the working tree is being edited. It holds the commit's files
# without results/ other than results/runs/mqar (the sweep's done runs), the wheels of .whl/, and
# the most advanced training states of .resume-carry/ gzipped into .devtree/.resume-carry/resume.tgz,
# as many as fit BUDGET_MB (default: the 64 MiB a call carries less this checkout's tracked
# files, which travel beside .devtree, less 1 MB). SLIM=1 leaves out tests/, docs/ and the FLA
# wheel, which an MQAR or NIAH sweep does not use (room for about 2 MB more of states).
#   [SLIM=1] bash benchmarks/devtree.sh [COMMIT]
# then: run(command="cd .devtree && ... bash benchmarks/h200_mqar.sh", carry=[".devtree"]).
set -euo pipefail
cd "$(dirname "$0")/.."
COMMIT=${1:-HEAD}
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
BUDGET=$(( ${BUDGET_MB:-0} * 1000000 ))
[ "$BUDGET" -gt 0 ] || BUDGET=$(( 64 * 1048576 - tracked - 1000000 ))
grep -qx "/.devtree/" .git/info/exclude 2>/dev/null || echo "/.devtree/" >> .git/info/exclude
rm -rf .devtree && mkdir .devtree
git archive "$COMMIT" | tar x -C .devtree
find .devtree/results -mindepth 1 -maxdepth 1 ! -name runs -exec rm -rf {} +
find .devtree/results/runs -mindepth 1 -maxdepth 1 ! -name mqar -exec rm -rf {} +
rm -f .devtree/docs/*.png
cp results/runs/mqar/*.json .devtree/results/runs/mqar/ 2>/dev/null || true  # records not yet committed
[ -d .whl ] && cp -r .whl .devtree/
if [ "${SLIM:-0}" != 0 ]; then rm -rf .devtree/tests .devtree/docs .devtree/.whl/fla_core-*.whl; fi
used=$(du -sb .devtree | cut -f1)
if [ -d .resume-carry/mqar ]; then
    # States by epochs done, most first: the closest to finishing are the dearest to lose.
    mapfile -t states < <(python3 - <<'PY'
import pathlib, torch
rows = []
for f in pathlib.Path(".resume-carry/mqar").glob("*/train_state.pt"):
    progress = torch.load(f, map_location="cpu", weights_only=False)["progress"]
    rows.append((progress["epoch"], f.parent.name))
for epoch, name in sorted(rows, reverse=True):
    print(name)
PY
)
    keep=()
    for s in "${states[@]}"; do
        size=$(du -sb ".resume-carry/mqar/$s" | cut -f1)
        if [ $(( used + size )) -le "$BUDGET" ]; then keep+=("mqar/$s"); used=$(( used + size )); else echo "left behind: $s"; fi
    done
    if [ ${#keep[@]} -gt 0 ]; then
        mkdir -p .devtree/.resume-carry && tar czf .devtree/.resume-carry/resume.tgz -C .resume-carry "${keep[@]}"
        echo "carrying ${#keep[@]} training states: ${keep[*]}"
    fi
fi
echo "$(du -sh .devtree | cut -f1) in .devtree, $(( tracked / 1000000 )) MB of tracked files beside it (64 MiB travel)"
