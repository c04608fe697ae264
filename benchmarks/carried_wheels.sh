# Sourced by the device scripts (from the repo root): install the wheels carried in .whl/
# into $SITE and put it on PYTHONPATH. .whl/*.whl is FLA (comparison only), always
# installed; .whl/harness/*.whl is pydantic and its dependencies, only where the image
# lacks pydantic. Without wheels, PYTHONPATH is just the repo.
SITE=${SITE:-/tmp/site}
export PYTHONPATH=.
wheels=$(ls .whl/*.whl 2>/dev/null)
python3 -c "import pydantic" 2>/dev/null || wheels="$wheels $(ls .whl/harness/*.whl 2>/dev/null)"
if [ -n "${wheels// /}" ]; then
    # shellcheck disable=SC2086
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $wheels || exit 1
    export PYTHONPATH="$SITE:."
fi
