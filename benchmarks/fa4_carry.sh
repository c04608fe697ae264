#!/usr/bin/env bash
# FlashAttention-4 (flash-attn-4 and its CuTe DSL) for the H200, whose image lacks it, in two
# device calls: its nvidia-cutlass-dsl-libs-cu13 wheel (92 MB) is over what one call carries.
#
# Here, once, from the repo root, with the wheels ../shared/anchors/README.md lists downloaded
# for Python 3.12 into WHEELS (the cu13 wheel beside the small ones):
#   bash benchmarks/fa4_carry.sh pack WHEELS
# writes .fa4a/ (the first part of the cu13 wheel's files as one xz stream) and .fa4b/ (the rest
# of the stream and the small wheels); both are git-ignored.
# On the device: a call that carries .fa4a runs `bash benchmarks/fa4_carry.sh stash` (the part
# waits in /tmp/fa4 on the warm machine); the next call, on the machine still warm, carries
# .fa4b and runs `source benchmarks/fa4_carry.sh install` after the device preamble: it unpacks
# into $SITE and puts the DSL's packages on PYTHONPATH (pip --target skips the wheel's .pth).
# When the first part is not there (the machine was given back between the calls) it says so
# and installs nothing; softmax's auto then passes FA4 over and says why.
mode=${1:-}
SITE=${SITE:-/tmp/site}
case "$mode" in
pack)
    set -euo pipefail
    wheels=${2:?usage: fa4_carry.sh pack WHEELS}
    cu13=$(ls "$wheels"/nvidia_cutlass_dsl_libs_cu13-*cp312*.whl) || exit 1
    rm -rf .fa4a .fa4b /tmp/fa4_pack && mkdir -p .fa4a .fa4b /tmp/fa4_pack
    grep -qx "/.fa4a/" .git/info/exclude || printf '/.fa4a/\n/.fa4b/\n' >> .git/info/exclude
    unzip -q "$cu13" -d /tmp/fa4_pack
    # xz takes the 92 MB wheel to ~64 MB: two calls' spare room.
    tar cf - -C /tmp/fa4_pack . | xz -T0 -9 | split -b "${PART_MB:-46}m" - /tmp/fa4_pack.part-
    mv /tmp/fa4_pack.part-aa .fa4a/ && mv /tmp/fa4_pack.part-* .fa4b/
    find "$wheels" -maxdepth 1 -name "*.whl" ! -name "nvidia_cutlass_dsl_libs_cu1*" -exec cp {} .fa4b/ \;
    rm -rf /tmp/fa4_pack
    du -sh .fa4a .fa4b
    ;;
stash)
    mkdir -p /tmp/fa4 && cp .fa4a/* /tmp/fa4/ && ls -la /tmp/fa4
    ;;
install)
    if [ ! -f /tmp/fa4/fa4_pack.part-aa ]; then
        echo "FA4: the first part (.fa4a) is not on this machine; FA4 not installed"
    else
        # The small wheels first: pip --target --upgrade replaces whole top-level folders, and
        # nvidia_cutlass_dsl/ is shared with the cu13 files unpacked after it.
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$SITE" .fa4b/*.whl \
            && cat /tmp/fa4/fa4_pack.part-aa .fa4b/fa4_pack.part-* | xz -d | tar xf - -C "$SITE" \
            && export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-.}" \
            && python3 -c "import flash_attn.cute; print('FA4: flash_attn.cute from', flash_attn.cute.__file__)"
    fi
    ;;
*)
    echo "usage: fa4_carry.sh pack WHEELS | stash | install" >&2; exit 2 ;;
esac
