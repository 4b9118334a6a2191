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
# airbench is not on every index (this one lacks it): the anchor is skipped without it
get --no-deps airbench || echo "airbench: not found, its anchor will be skipped"
# slim Ray: no Java, no dashboard web build. The entries are copied with their zip headers
# so that the executables (gcs_server, raylet) keep their mode bits: `zipfile -c` drops
# them, and Ray then fails at start with "Permission denied: .../gcs_server".
ray=$(ls .whl/ray-*.whl)
python3 - "$ray" <<'PYEOF'
import os, sys, zipfile
src = sys.argv[1]
dropped = ("ray/jars/", "ray/dashboard/client/build/")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(src + ".slim", "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if not info.filename.startswith(dropped):
            zout.writestr(info, zin.read(info), compress_type=zipfile.ZIP_DEFLATED)
os.replace(src + ".slim", src)
PYEOF
python3 -c "import sys, zipfile
z = zipfile.ZipFile(sys.argv[1]); i = z.getinfo('ray/core/src/ray/gcs/gcs_server')
assert (i.external_attr >> 16) & 0o111, 'gcs_server lost its executable bit'" "$ray"


# A slice of Fashion-MNIST in its own idx format (the first 6,000 training and 1,000 test
# images, ~5 MB) for the Ray CNN figures: the whole set does not fit beside the wheels.
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  python3 - <<'PYEOF'
import gzip, os, struct
src, dst = "/usr/share/datasets/fashion-mnist", ".whl/fashion-mnist"
os.makedirs(dst, exist_ok=True)
for name, keep in (("train", 6000), ("t10k", 1000)):
    for kind, item in (("images-idx3", 784), ("labels-idx1", 1)):
        raw = gzip.open(f"{src}/{name}-{kind}-ubyte.gz").read()
        ndim = raw[3]
        dims = list(struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim]))
        body = raw[4 + 4 * ndim : 4 + 4 * ndim + keep * item]
        dims[0] = keep
        with gzip.open(f"{dst}/{name}-{kind}-ubyte.gz", "wb") as f:
            f.write(raw[:4] + struct.pack(f">{ndim}I", *dims) + body)
PYEOF
  du -sh .whl/fashion-mnist
fi
du -sh .whl; ls -1 .whl
