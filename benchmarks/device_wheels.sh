#!/usr/bin/env bash
# The Python packages the GPU machine's image lacks, as cp312 wheels in .whl/ (git-ignored
# through .git/info/exclude) for the device tool's `carry`: pydantic (config), Ray (the
# Ray engine's GPU and 16-core figures), jsonschema (Ray's runtime environments) and
# airbench (the second anchor of `raycobo bench paper`). Ray's wheel is slimmed (its Java
# jar and the dashboard's static web build are dropped) so that everything fits the
# 64 MiB the device tool carries. On the machine:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# Usage: benchmarks/device_wheels.sh   (here, with PyPI reachable)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
get() {
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLAT[@]}" -d .whl "$@"
}
get "pydantic==2.12.*"  # with the pydantic-core it pins
get --no-deps "ray==2.60.*" jsonschema jsonschema-specifications referencing rpds-py
get --no-deps airbench
# slim Ray: no Java, no dashboard web build
ray=$(ls .whl/ray-*.whl)
tmp=$(mktemp -d)
(cd "$tmp" && python3 -m zipfile -e "$OLDPWD/$ray" .)
rm -rf "$tmp"/ray/jars "$tmp"/ray/dashboard/client/build
rm "$ray"
(cd "$tmp" && python3 -m zipfile -c "$OLDPWD/$ray" ./*)
rm -rf "$tmp"
du -sh .whl
ls -1 .whl
