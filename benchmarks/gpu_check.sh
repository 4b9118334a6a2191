#!/usr/bin/env bash
# Everything the open GPU issue measures, in one call of the device tool (fits its 600 s):
#   1. `raycobo bench paper`: the CoBo paper's ResNet-9 rounds at full size (cross-silo,
#      8 clients; cross-device, 80 clients; batch 128) in fp32, tf32 and bf16, NCHW and
#      channels-last, against one plain ResNet-9 at the same settings (the practical
#      limit), with the projected wall time of the paper's runs;
#   2. benchmarks/airbench_anchor.py: airbench's CIFAR-10 trainer, images/s (anchor 2);
#   3. the GPU tests (pytest -m gpu): every method on CUDA = CPU (Top-K's tie fix
#      included), engine.precision within its tolerance, bf16 + channels-last accuracy
#      parity, Ray hosts on GPU fractions = CPU, the fractions' accounting;
#   4. Ray on 16 cores: CNN, 80 clients, 8 resident hosts x 2 threads against the local
#      engine, with the hosts' start-up time; and 80 clients as 4 hosts x 0.25 GPU
#      against the local engine on the same GPU;
#   5. what CoBo's defaults cost a round (`raycobo bench engine`): gradients a round and
#      time against Local's and the paper preset's, with one minibatch an end
#      (cobo-alignment_batches) beside them; MLP at 20, 80 and 800 clients and the CNN at
#      12, on CUDA and on 2 of the machine's CPU threads (a quiet 2-core box's figures).
# Prepare the wheels here first (benchmarks/device_wheels.sh), then call the device tool
# with carry [".whl"] and the command:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && \
#     OUT=$OUT benchmarks/gpu_check.sh
# RAY=0: no Ray there (step 4 and the Ray tests are left out). STEPS=1,2,3,4,5 picks steps;
# PAPER="--setting cross_device --precision bf16" narrows step 1.
set -u
OUT=${OUT:-gpu_check}
PY=${PY:-python3}
RAY=${RAY:-1}
STEPS=${STEPS:-1,2,3,4,5}
PAPER=${PAPER:---setting cross_device,cross_silo --precision fp32,tf32,bf16 --layout nchw,nhwc}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD  # the tests import tests.helpers
# the Fashion-MNIST slice benchmarks/device_wheels.sh writes (6,000 images: fraction 0.5
# gives the 3,000 of the default fraction 0.05 of the full set)
FMNIST=()
[ -d .whl/fashion-mnist ] && FMNIST=(--data-root .whl/fashion-mnist --fraction 0.5)
want() { [[ ",$STEPS," == *",$1,"* ]]; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import os, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'cpus', os.cpu_count(), 'torch threads', torch.get_num_threads())" | tee -a "$OUT/gpu.txt"
uptime | tee -a "$OUT/gpu.txt"
set -o pipefail

if want 1; then
  # shellcheck disable=SC2086 # PAPER is a list of options
  timeout 200 "$PY" -m raycobo bench paper --device cuda $PAPER --rounds 2 --out "$OUT" \
    2>&1 | tee "$OUT/paper.log"
fi
if want 2 && "$PY" -c "import airbench" 2>/dev/null; then
  timeout 90 "$PY" benchmarks/airbench_anchor.py --dir /tmp/airbench 2>&1 | tee "$OUT/airbench.log"
fi
if want 3; then
  # ray.get times out after 30 s in these tests; --timeout stops anything else that hangs
  timeout 130 "$PY" -m pytest -m gpu tests/engine/test_gpu.py -q -p no:cacheprovider \
    --timeout 90 -rfE --tb=short 2>&1 | tee "$OUT/pytest_gpu.log"
  echo "pytest exit: $?" | tee -a "$OUT/pytest_gpu.log"
fi
if want 4 && [ "$RAY" = 1 ]; then
  # 16 cores: 8 resident hosts x 2 threads, CNN, 80 clients, against the local engine
  timeout 130 "$PY" -m raycobo bench ray --model cnn --clients 80 --per-actor 10 \
    --schedule sync,resident --host-threads 2 --threads 16 --rounds 5 --out "$OUT" "${FMNIST[@]}" \
    2>&1 | tee "$OUT/ray.log"
  # one GPU: 4 hosts x 0.25 of it (80 clients x 1/80) against the local engine on CUDA
  timeout 90 "$PY" -m raycobo bench ray --model cnn --clients 80 --per-actor 20 \
    --schedule sync,resident --device cuda --gpus-per-client 0.0125 --rounds 5 "${FMNIST[@]}" \
    2>&1 | tee -a "$OUT/ray.log"
fi
if want 5; then
  COST=(--algorithms cobo,cobo-alignment_batches --no-loop --rounds 5)
  for dev in cuda cpu; do
    threads=(); [ "$dev" = cpu ] && threads=(--threads 2)
    timeout $([ "$dev" = cpu ] && echo 150 || echo 90) "$PY" -m raycobo bench engine --device "$dev" --model mlp --clients 20,80,800 \
      "${COST[@]}" "${threads[@]}" --out "$OUT/cost-$dev-mlp" 2>&1 | tee -a "$OUT/cost.log"
    timeout 60 "$PY" -m raycobo bench engine --device "$dev" --model cnn --clients 12 \
      "${COST[@]}" "${threads[@]}" --out "$OUT/cost-$dev-cnn" 2>&1 | tee -a "$OUT/cost.log"
  done
fi
exit 0
