#!/usr/bin/env bash
# Device check for `echo-tune profile` and `echo-tune emulate` on ONE NVIDIA GPU (H100 / H200 / A100).
# NOT YET RUN ON A GPU: written and checked on CPU only (the CPU paths are covered by the tests).
#
# 1. profiles a Llama-3 8B layout (TP2 PP4, bf16) and a GPT-3-175B-shaped layer (TP8, bf16) into
#    calibration/<cluster>/optime.sqlite (ops timed in place with CUDA events in real micro-batches);
# 2. prints measured op times vs the datasheet-derived surface (benchmarks/optime_vs_surface.py);
# 3. emulates stage 0 and the last stage of the Llama-3 8B layout and prints simulate vs emulate.
# Expected cost: a few minutes (an estimate: two shapes x 20 micro-batches of one layer; two stages x 4 runs).
# Usage: bash benchmarks/device_check.sh            (from the repository root; OUT=dir for the logs)
set -euo pipefail
OUT=${OUT:-device-check}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$PWD}
name=$(python -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')")
case "$name" in
  *H200*) cluster=h200-sxm ;;
  *H100*) cluster=h100-sxm ;;
  *H800*) cluster=h800-sxm ;;
  *A100*80GB*) cluster=a100-80gb ;;
  *A100*) cluster=a100-40gb ;;
  *) echo "device_check: needs an NVIDIA H100/H200/H800/A100, torch sees '${name:-no CUDA device}'" >&2; exit 2 ;;
esac
echo "device: $name -> cluster preset $cluster" | tee "$OUT/summary.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/summary.txt"

LLAMA=(--model llama3-8b --cluster "$cluster" --num-gpus 8 --tensor-model-parallel-size 2
       --pipeline-model-parallel-size 4 --global-batch-size 8 --bf16)
GPT3=(--model gpt3-175b --cluster "$cluster" --num-gpus 1024 --tensor-model-parallel-size 8
      --pipeline-model-parallel-size 16 --global-batch-size 1536 --sequence-parallel --bf16)
PROFILE=calibration/$cluster/profile-optime.yaml

time echo-tune profile "${LLAMA[@]}" --quiet --json | tee "$OUT/profile-llama3-8b.json"
time echo-tune profile "${GPT3[@]}" --quiet --json | tee "$OUT/profile-gpt3.json"

echo "== measured op times vs the datasheet surface ==" | tee -a "$OUT/summary.txt"
python benchmarks/optime_vs_surface.py --model llama3-8b --cluster "$cluster" --num-gpus 8 --profile "$PROFILE" \
  --tp 2 --pp 4 --global-batch-size 8 | tee -a "$OUT/summary.txt"
python benchmarks/optime_vs_surface.py --model gpt3-175b --cluster "$cluster" --num-gpus 1024 --profile "$PROFILE" \
  --tp 8 --pp 16 --global-batch-size 1536 | tee -a "$OUT/summary.txt"

echo "== simulate vs emulate, Llama-3 8B TP2 PP4 ==" | tee -a "$OUT/summary.txt"
for stage in 0 3; do
  time echo-tune emulate "${LLAMA[@]}" --profile "$PROFILE" --stage "$stage" --repeats 3 | tee -a "$OUT/summary.txt"
  echo-tune emulate "${LLAMA[@]}" --profile "$PROFILE" --stage "$stage" --repeats 3 --json \
    > "$OUT/emulate-stage$stage.json"
done
cp calibration/"$cluster"/optime.sqlite "$OUT/" 2>/dev/null || true
echo "device_check: done, logs in $OUT/"
