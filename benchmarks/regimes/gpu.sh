#!/usr/bin/env bash
# The regime matrix's GPU cells (cells.yaml, `gpu: true`) and the 800-client cell's
# validation split, in one call of the device tool: Local, Oracle and CoBo's defaults on
# CUDA, several runs at once on one GPU (each a process of one torch thread).
# Prepare here (git-ignored .dev/, ~32 MB: the whole Fashion-MNIST in its idx files, as
# the cells draw from all of it, and pydantic's cp312 wheels, which the image lacks):
#   echo /.dev/ >> .git/info/exclude; mkdir -p .dev/fashion-mnist
#   cp /usr/share/datasets/fashion-mnist/*.gz .dev/fashion-mnist/
#   python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .dev "pydantic==2.12.*"
# then call the device tool with carry [".dev"] and the command:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .dev/*.whl &&
#   PYTHONPATH=/tmp/site:$PWD OUT=$OUT DATA=.dev/fashion-mnist benchmarks/regimes/gpu.sh
# (three such calls of 150-210 s each gave the GPU rows of FIDELITY.md on an H200)
# Results: $OUT/{test,validation}.jsonl (run.py's rows), $OUT/gpu_regimes.log.
# CANDIDATES: named candidates (candidates.yaml) for the validation split, comma-separated;
# VSEEDS: the validation split's seeds (default 0), comma-separated.
set -u
OUT=${OUT:-gpu_regimes}
DATA=${DATA:?the folder with Fashion-MNIST\'s idx files}
LIMIT=${LIMIT:-520}  # seconds for every run.py call
CANDIDATES=${CANDIDATES:-}
VSEEDS=${VSEEDS:-0}
export PYTHONUNBUFFERED=1
here=$(dirname "$0")
WORK=$(mktemp -d)  # run.py's folders; only the merged rows and one log go to $OUT
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
go() {  # name, then run.py's arguments
  local name=$1
  shift
  timeout "$LIMIT" python3 "$here/run.py" --device cuda --data-root "$DATA" --threads 1 \
    --out "$WORK/$name" "$@" >"$WORK/$name.log" 2>&1 &
}
go r5000 --split test --cells fmnist-800-r5000 --seeds 0 --jobs 3
go n1600 --split test --cells fmnist-1600-r2000 --seeds 0 --jobs 3
go val800 --split validation --cells fmnist-800-r1000 --seeds "$VSEEDS" --jobs 3
[ -n "$CANDIDATES" ] && go cand800 --split validation --cells fmnist-800-r1000 --seeds "$VSEEDS" \
  --no-baselines --candidates "$CANDIDATES" --jobs "$(echo "$CANDIDATES" | tr ',' '\n' | wc -l)"
wait
# one results file per split, beside the logs
for split in test validation; do
  cat "$WORK"/*/"$split"/results.jsonl >"$OUT/$split.jsonl" 2>/dev/null
done
for f in "$WORK"/*.log; do echo "== $f"; cat "$f"; done >"$OUT/gpu_regimes.log"
tail -n 40 "$OUT/gpu_regimes.log"
