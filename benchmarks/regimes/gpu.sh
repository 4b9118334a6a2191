#!/usr/bin/env bash
# Regime-matrix runs on the GPU machine in one call of the device tool: several run.py
# calls at once on one GPU (each of their runs a process of one torch thread).
# Prepare here (git-ignored .dev/, ~32 MB: the whole Fashion-MNIST in its idx files, as
# the cells draw from all of it, and pydantic's cp312 wheels, which the image lacks):
#   echo /.dev/ >> .git/info/exclude; mkdir -p .dev/fashion-mnist
#   cp /usr/share/datasets/fashion-mnist/*.gz .dev/fashion-mnist/
#   python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .dev "pydantic==2.12.*"
# then call the device tool with carry [".dev"] and the command:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .dev/*.whl &&
#   PYTHONPATH=/tmp/site:$PWD OUT=$OUT DATA=.dev/fashion-mnist benchmarks/regimes/gpu.sh
# (three such calls of 150-210 s each gave the first GPU rows of FIDELITY.md on an H200)
# PLAN: a file of run.py calls, one a line, `name: run.py's arguments` (# starts a
# comment); without it, the GPU cells' test split and the 800-client cell's validation
# split (CANDIDATES: named candidates for it, comma-separated; VSEEDS: its seeds).
# Every call starts from the repository's rows (results/<split>/results.jsonl), so that
# runs already there are not run again; only the rows it adds come back.
# Results: $OUT/{test,validation}.jsonl (run.py's new rows), $OUT/gpu_regimes.log.
# PYTEST=1: the GPU tests of the local engine (tests/engine/test_gpu.py, no Ray there)
# beside the runs, in $OUT/pytest_gpu.log.
set -u
OUT=${OUT:-gpu_regimes}
DATA=${DATA:?the folder with Fashion-MNIST\'s idx files}
LIMIT=${LIMIT:-520}  # seconds for every run.py call
PLAN=${PLAN:-}
CANDIDATES=${CANDIDATES:-}
VSEEDS=${VSEEDS:-0}
PYTEST=${PYTEST:-0}
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
WORK=$(mktemp -d)  # run.py's folders; only the new rows and one log go to $OUT
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
go() {  # name, then run.py's arguments
  local name=$1
  shift
  for split in test validation; do  # the repository's rows: runs done are not run again
    mkdir -p "$WORK/$name/$split"
    cp "$here/results/$split/results.jsonl" "$WORK/$name/$split/results.jsonl"
  done
  timeout "$LIMIT" python3 "$here/run.py" --device cuda --data-root "$DATA" --threads 1 \
    --out "$WORK/$name" "$@" >"$WORK/$name.log" 2>&1 &
}
if [ "$PYTEST" = 1 ]; then
  timeout "$LIMIT" python3 -m pytest -m gpu tests/engine/test_gpu.py -q -p no:cacheprovider \
    -rfE --tb=short >"$OUT/pytest_gpu.log" 2>&1 &
fi
if [ -n "$PLAN" ]; then
  while IFS= read -r line; do
    line=${line%%#*}
    [ -z "${line// /}" ] && continue
    # shellcheck disable=SC2086  # the arguments split as a shell would
    go "${line%%:*}" ${line#*:}
  done <"$PLAN"
else
  go r5000 --split test --cells fmnist-800-r5000 --seeds 0 --jobs 3
  go n1600 --split test --cells fmnist-1600-r2000 --seeds 0 --jobs 3
  go val800 --split validation --cells fmnist-800-r1000 --seeds "$VSEEDS" --jobs 3
  [ -n "$CANDIDATES" ] && go cand800 --split validation --cells fmnist-800-r1000 \
    --seeds "$VSEEDS" --no-baselines --candidates "$CANDIDATES" \
    --jobs "$(echo "$CANDIDATES" | tr ',' '\n' | wc -l)"
fi
wait
# one file per split of the rows the calls added, beside the logs
for split in test validation; do
  : >"$OUT/$split.jsonl"
  seeded=$(wc -l <"$here/results/$split/results.jsonl")
  for f in "$WORK"/*/"$split"/results.jsonl; do
    tail -n +"$((seeded + 1))" "$f" >>"$OUT/$split.jsonl"
  done
done
for f in "$WORK"/*.log; do echo "== $f"; cat "$f"; done >"$OUT/gpu_regimes.log"
tail -n 40 "$OUT/gpu_regimes.log"
wc -l "$OUT"/*.jsonl
