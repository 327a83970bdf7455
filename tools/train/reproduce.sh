#!/bin/bash
# Reproduce the shipped model from a seed in one command, on a machine with
# a CUDA GPU, PyTorch, transformers and tokenizers (about 16 minutes of
# training on one H100, then about 1 minute of evaluation):
#   tools/train/reproduce.sh KJV.txt.gz OUT_DIR [SEED]
# KJV.txt.gz comes from tools/train/kjv.sh (Debian's bible-kjv-text).
# SPLIT=STEP stops at STEP and resumes from the checkpoint, as the shipped
# run did (at step 8517, between two 10-minute device commands); without it
# the run is unbroken (the same data and schedule; see README.md for what
# differs).  Writes OUT_DIR/tokenizer.json, the checkpoint, eval.json,
# ref.json and OUT_DIR/sift-needle-14m-f16.gguf.
set -euo pipefail
kjv=${1:?usage: reproduce.sh KJV.txt.gz OUT_DIR [SEED]}
out=${2:?usage: reproduce.sh KJV.txt.gz OUT_DIR [SEED]}
seed=${3:-1}
T=$(dirname "$0")
mkdir -p "$out"
python3 "$T/make_tokenizer.py" --kjv "$kjv" --out "$out/tokenizer.json" --seed "$seed"
common=(--kjv "$kjv" --tokenizer "$out/tokenizer.json" --out "$out" --seed "$seed"
        --steps 14000 --decay-steps 3000 --workers 12)
if [ -n "${SPLIT:-}" ]; then
  python3 "$T/train.py" "${common[@]}" --stop-step "$SPLIT"
  python3 "$T/train.py" "${common[@]}" --resume "$out"
else
  python3 "$T/train.py" "${common[@]}"
fi
python3 "$T/evaluate.py" --ckpt "$out" --kjv "$kjv" --tokenizer "$out/tokenizer.json" \
  --ref-out "$out/ref.json" --eval-out "$out/eval.json" --n 25
python3 "$T/export.py" --ckpt "$out" --tokenizer "$out/tokenizer.json" \
  --out "$out/sift-needle-14m-f16.gguf" --check "$out/ref.json"
