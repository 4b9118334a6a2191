#!/usr/bin/env bash
# The Ray engine's fractional-GPU path on a machine with a GPU, in one go:
#   1. the GPU tests (pytest -m gpu): local engine on CUDA and Ray hosts on GPU
#      fractions give the CPU's numbers; fractions share one GPU and Ray accounts them;
#   2. `raycobo bench ray` with the hosts on 1/80 of a GPU each and the local engine on
#      CUDA, n = 8, 40, 80 and 1, 8, 40 clients per host (host-resident models or not);
#   3. `raycobo bench engine --device cuda`: cnn and resnet9 at n = 8, 40, 80 (and
#      resnet9 at the paper's batch of 128), the local engine against the per-client loop,
#      with peak GPU memory; `raycobo bench profile` of one round at n = 80;
#   4. benchmarks/topk_cuda_diag.py: where Top-K with error feedback leaves the CPU's path.
# Usage: OUT=results/ [RAY=0] [FMNIST=folder-of-idx-files FRACTION=0.05] benchmarks/gpu_check.sh
# RAY=0 (Ray not installed there): the Ray tests skip and step 2 is left out.
# nvidia-smi's list of processes on the GPU is sampled every 2 s into $OUT/gpu_apps.csv.
set -u
OUT=${OUT:-gpu_check}
PY=${PY:-python3}
FRACTION=${FRACTION:-0.05}
GPC=${GPC:-0.0125}
RAY=${RAY:-1}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
data=()
[ -n "${FMNIST:-}" ] && data=(--data-root "$FMNIST" --fraction "$FRACTION")
bench=("$PY" -m raycobo bench ray --device cuda --gpus-per-client "$GPC" "${data[@]}")

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'cpus', os.cpu_count(), 'torch threads', torch.get_num_threads())" | tee -a "$OUT/gpu.txt"
(while sleep 2; do
   nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | \
     sed "s/^/$(date +%s),/" >> "$OUT/gpu_apps.csv"
 done) &
sampler=$!

set -o pipefail
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD  # benchmarks/ and the tests import tests.helpers
timeout 60 "$PY" benchmarks/topk_cuda_diag.py 2>&1 | tee "$OUT/topk_diag.log"
if [ "$RAY" = 1 ]; then
  mkdir -p "$OUT/b1" "$OUT/b2" "$OUT/b3"
  timeout 150 "${bench[@]}" --clients 8,40,80 --per-actor 8,40 --resident both --out "$OUT/b1" \
    2>&1 | tee "$OUT/bench.log"
  timeout 70 "${bench[@]}" --clients 8,40 --per-actor 1 --resident no --rounds 5 --out "$OUT/b2" \
    2>&1 | tee -a "$OUT/bench.log"
  timeout 90 "${bench[@]}" --clients 80 --per-actor 1 --resident no --rounds 5 --out "$OUT/b3" \
    2>&1 | tee -a "$OUT/bench.log"
fi
# the local engine on CUDA (strategy auto: memory-bounded vmap) against the per-client
# loop on CUDA, conv nets at the paper's scale (issue "Local engine": >= 8x at n = 80)
mkdir -p "$OUT/b4" "$OUT/b5"
timeout 300 "$PY" -m raycobo bench engine --device cuda --model cnn,resnet9 --clients 8,40,80 \
  --rounds 2 --out "$OUT/b4" 2>&1 | tee -a "$OUT/bench.log"
timeout 120 "$PY" -m raycobo bench engine --device cuda --model resnet9 --clients 80 \
  --batch-size 128 --rounds 2 --out "$OUT/b5" 2>&1 | tee -a "$OUT/bench.log"
for m in cnn resnet9; do
  timeout 90 "$PY" -m raycobo bench profile --device cuda --model $m --clients 80 --rows 30 \
    2>&1 | tee -a "$OUT/profile.log"
done
# ray.get times out after 30 s in these tests; --timeout stops anything else that hangs
timeout 120 "$PY" -m pytest -m gpu tests/engine/test_gpu.py -q -p no:cacheprovider \
  --timeout 90 -rfE --tb=short 2>&1 | tee "$OUT/pytest_gpu.log"
echo "pytest exit: $?" | tee -a "$OUT/pytest_gpu.log"
kill $sampler 2>/dev/null
exit 0
