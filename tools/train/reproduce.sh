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
# STAGE2=1 then runs the multikey fine-tune (stage 2; about 5 minutes) from
# that F16 GGUF, as measured in models/README.md ("Stage 2, not shipped"):
# its checkpoint, eval.json, ref.json and sift-needle-14m-stage2-f16.gguf
# go to OUT_DIR/stage2/.  Its weights are not the shipped ones: it did not
# improve multikey.
set -euo pipefail
kjv=${1:?usage: reproduce.sh KJV.txt.gz OUT_DIR [SEED]}
out=${2:?usage: reproduce.sh KJV.txt.gz OUT_DIR [SEED]}
seed=${3:-1}
T=$(dirname "$0")
mkdir -p "$out"
tokj=$out/tokenizer.json
python3 "$T/make_tokenizer.py" --kjv "$kjv" --out "$tokj" --seed "$seed"
common=(--kjv "$kjv" --tokenizer "$tokj" --out "$out" --seed "$seed"
        --steps 14000 --decay-steps 3000 --workers 12)
if [ -n "${SPLIT:-}" ]; then
  python3 "$T/train.py" "${common[@]}" --stop-step "$SPLIT"
  python3 "$T/train.py" "${common[@]}" --resume "$out"
else
  python3 "$T/train.py" "${common[@]}"
fi
python3 "$T/evaluate.py" --ckpt "$out" --kjv "$kjv" --tokenizer "$tokj" \
  --ref-out "$out/ref.json" --eval-out "$out/eval.json" --n 25
python3 "$T/export.py" --ckpt "$out" --tokenizer "$tokj" \
  --out "$out/sift-needle-14m-f16.gguf" --check "$out/ref.json"
[ "${STAGE2:-0}" = 1 ] || exit 0
# Stage 2 starts from stage 1's F16 weights (the GGUF just written), with
# the same seed; its data come from other random streams (train.py --mix).
s2=$out/stage2
mkdir -p "$s2"
python3 "$T/import_gguf.py" --gguf "$out/sift-needle-14m-f16.gguf" --tokenizer "$tokj" \
  --roundtrip --ref-json "$out/ref.json"
python3 "$T/train.py" --kjv "$kjv" --tokenizer "$tokj" --out "$s2" --seed "$seed" \
  --init-gguf "$out/sift-needle-14m-f16.gguf" --mix multikey --schedule 0:16384 \
  --steps 4000 --lr 3e-4 --warmup 200 --decay-steps 3800 --workers 12
python3 "$T/evaluate.py" --ckpt "$s2" --kjv "$kjv" --tokenizer "$tokj" \
  --ref-out "$s2/ref.json" --eval-out "$s2/eval.json" --n 25
python3 "$T/export.py" --ckpt "$s2" --tokenizer "$tokj" --name sift-needle-14m-stage2 \
  --out "$s2/sift-needle-14m-stage2-f16.gguf" --check "$s2/ref.json"
