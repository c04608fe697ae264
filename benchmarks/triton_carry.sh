#!/usr/bin/env bash
# Another Triton for the device, whose image has Triton 3.6: FLA 0.6.0 refuses the backward of
# its gated kernels (GDN, simple GLA) on Triton >= 3.4 and < 3.7.1 on Hopper, so a forward+
# backward beside FLA's needs 3.7.1 or later in the same process. The wheel (198 MB, libtriton
# 461 MB unpacked with its debug symbols) is over one call's 64 MiB; stripped, without the
# profiler (proton, CUPTI), the AMD backend and the bundled CUDA tools, it packs to ~37 MB of xz.
#
# Here, once, from the repo root:
#   bash benchmarks/triton_carry.sh pack [VERSION]      # default 3.7.1; writes .triton/ (ignored)
# On the device, a call that carries .triton runs, after the device preamble,
#   source benchmarks/triton_carry.sh install
# which unpacks it into /tmp/triton_site, copies the image Triton's ptxas, cuobjdump and nvdisasm
# into it (the packed tree leaves its own out; they come from one CUDA release), puts it first
# on PYTHONPATH and prints the version that imports. Records name the Triton that ran.
mode=${1:-}
TRITON_SITE=${TRITON_SITE:-/tmp/triton_site}
case "$mode" in
pack)
    set -euo pipefail
    version=${2:-3.7.1}
    rm -rf .triton /tmp/triton_pack && mkdir -p .triton /tmp/triton_pack
    grep -qx "/.triton/" .git/info/exclude || echo "/.triton/" >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        -d /tmp/triton_pack "triton==$version"
    cd /tmp/triton_pack && unzip -q triton-*.whl && rm triton-*.whl
    rm -rf triton/backends/amd triton/backends/nvidia/lib/cupti triton/backends/nvidia/bin triton/instrumentation \
        triton/_C/libproton.so
    strip --strip-unneeded triton/_C/libtriton.so
    cd - >/dev/null
    tar cf - -C /tmp/triton_pack . | xz -T0 -9 > ".triton/triton-$version.tar.xz"
    rm -rf /tmp/triton_pack
    du -sh .triton
    ;;
install)
    packed=$(ls .triton/triton-*.tar.xz 2>/dev/null | head -n 1)
    if [ -z "$packed" ]; then
        echo "triton_carry: no .triton/triton-*.tar.xz carried; the image's Triton stays"
    else
        image_bin=$(python3 -c "import os, triton; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin
        rm -rf "$TRITON_SITE" && mkdir -p "$TRITON_SITE" \
            && xz -dc "$packed" | tar xf - -C "$TRITON_SITE" \
            && sed -i "/amd/d" "$TRITON_SITE"/triton-*.dist-info/entry_points.txt \
            && mkdir -p "$TRITON_SITE/triton/backends/nvidia/bin" \
            && cp "$image_bin"/* "$TRITON_SITE/triton/backends/nvidia/bin/" \
            && export PYTHONPATH="$TRITON_SITE:${PYTHONPATH:-.}" \
            && python3 -c "import triton; print('triton_carry: Triton', triton.__version__, 'from', triton.__file__)"
    fi
    ;;
*)
    echo "usage: triton_carry.sh pack [VERSION] | install" >&2; exit 2 ;;
esac
