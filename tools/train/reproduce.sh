#!/bin/bash
# Reproduce the shipped model from a seed in one command, on a machine with
# a CUDA GPU, PyTorch, transformers and tokenizers (about 12 minutes of
# training on one H100 or H200, then a minute of evaluation):
#   tools/train/reproduce.sh KJV.txt.gz OUT_DIR [SEED]
# KJV.txt.gz comes from tools/train/kjv.sh (Debian's bible-kjv-text).
# The shipped model, sift-needle-14m v3 (models/README.md), is two stages:
# - stage 1, v2's recipe: 6,758 steps from scratch, the curriculum at 16K
#   from step 4,500, multikey questions asking a random key of the group.
#   Writes OUT_DIR/tokenizer.json (the same as models/tokenizer.json for
#   seed 1), the checkpoint, eval.json, ref.json and
#   OUT_DIR/sift-needle-14m-v2-f16.gguf.  The shipped run was one device
#   command with a time budget (device_oneshot.sh), which moved its end
#   from step 7,000 to 6,758 at step 4,710 (train.py --fit-budget); the
#   schedule here is the one it ran.
# - stage 3, the fine-tune from v2's F16 GGUF (train.py --init-gguf --mix
#   stage3): 5,383 steps at lr 3e-4 (warmup 200, decay over the last 3,000),
#   every length 1K-16K as likely, the same seed on stage 3's own random
#   streams.  Its checkpoint, eval.json and ref.json go to OUT_DIR/stage3/,
#   the model to OUT_DIR/sift-needle-14m-f16.gguf.  The shipped run was one
#   device command (device_stage3.sh), whose budget moved its end from step
#   8,000 to 5,383 at step 210, before the decay began; the schedule here is
#   the one it ran.  STAGE3=0 stops after stage 1.
# V1=1 reproduces the first model instead (v1: 14,000 steps, the old
# curriculum, multikey asking the group's first key: a model can pass that
# by answering the first needle; no stage 3); SPLIT=STEP then stops at STEP
# and resumes from the checkpoint, as v1's run did (at step 8517).
# STAGE2=1 then runs the multikey fine-tune (stage 2; about 5 minutes) from
# the stage-1 GGUF, as measured in models/README.md ("Stage 2, not
# shipped", run from v1: V1=1 STAGE2=1): its checkpoint, eval.json,
# ref.json and sift-needle-14m-stage2-f16.gguf go to OUT_DIR/stage2/.
set -euo pipefail
kjv=${1:?usage: reproduce.sh KJV.txt.gz OUT_DIR [SEED]}
out=${2:?usage: reproduce.sh KJV.txt.gz OUT_DIR [SEED]}
seed=${3:-1}
T=$(dirname "$0")
mkdir -p "$out"
tokj=$out/tokenizer.json
python3 "$T/make_tokenizer.py" --kjv "$kjv" --out "$tokj" --seed "$seed"
stage3=${STAGE3:-1}
if [ "${V1:-0}" = 1 ]; then
  stage1=$out/sift-needle-14m-v1-f16.gguf
  stage3=0
  common=(--kjv "$kjv" --tokenizer "$tokj" --out "$out" --seed "$seed" --multikey-ask first
          --steps 14000 --decay-steps 3000 --workers 12)
  eval_args=(--multikey-ask first --n 25)
else
  stage1=$out/sift-needle-14m-v2-f16.gguf
  common=(--kjv "$kjv" --tokenizer "$tokj" --out "$out" --seed "$seed"
          --steps 6758 --decay-steps 2000 --warmup 300 --workers 12
          --schedule 0:512,400:1024,1000:2048,2000:4096,3200:8192,4500:16384)
  eval_args=(--n 20)
fi
if [ -n "${SPLIT:-}" ]; then
  python3 "$T/train.py" "${common[@]}" --stop-step "$SPLIT"
  python3 "$T/train.py" "${common[@]}" --resume "$out"
else
  python3 "$T/train.py" "${common[@]}"
fi
python3 "$T/evaluate.py" --ckpt "$out" --kjv "$kjv" --tokenizer "$tokj" \
  --ref-out "$out/ref.json" --eval-out "$out/eval.json" "${eval_args[@]}"
python3 "$T/export.py" --ckpt "$out" --tokenizer "$tokj" \
  --out "$stage1" --check "$out/ref.json"
# The fine-tunes start from stage 1's F16 weights (the GGUF just written),
# with the same seed; their data come from other random streams (train.py
# --mix).  The import is checked first: the same bytes when exported again,
# and ref.json's logits.
if [ "$stage3" = 1 ] || [ "${STAGE2:-0}" = 1 ]; then
  python3 "$T/import_gguf.py" --gguf "$stage1" --tokenizer "$tokj" \
    --roundtrip --ref-json "$out/ref.json"
fi
if [ "$stage3" = 1 ]; then
  s3=$out/stage3
  mkdir -p "$s3"
  python3 "$T/train.py" --kjv "$kjv" --tokenizer "$tokj" --out "$s3" --seed "$seed" \
    --init-gguf "$stage1" --mix stage3 --schedule 0:16384 --min-len 1024 --top-share 0.2 \
    --steps 5383 --lr 3e-4 --warmup 200 --decay-steps 3000 --workers 14
  python3 "$T/evaluate.py" --ckpt "$s3" --kjv "$kjv" --tokenizer "$tokj" \
    --ref-out "$s3/ref.json" --eval-out "$s3/eval.json" --n 20 --lengths 1024,2048,4096,8192,16384
  python3 "$T/export.py" --ckpt "$s3" --tokenizer "$tokj" \
    --out "$out/sift-needle-14m-f16.gguf" --check "$s3/ref.json"
fi
[ "${STAGE2:-0}" = 1 ] || exit 0
s2=$out/stage2
mkdir -p "$s2"
python3 "$T/train.py" --kjv "$kjv" --tokenizer "$tokj" --out "$s2" --seed "$seed" \
  --init-gguf "$stage1" --mix multikey --schedule 0:16384 \
  --steps 4000 --lr 3e-4 --warmup 200 --decay-steps 3800 --workers 12
python3 "$T/evaluate.py" --ckpt "$s2" --kjv "$kjv" --tokenizer "$tokj" \
  --ref-out "$s2/ref.json" --eval-out "$s2/eval.json" --n 25
python3 "$T/export.py" --ckpt "$s2" --tokenizer "$tokj" --name sift-needle-14m-stage2 \
  --out "$s2/sift-needle-14m-stage2-f16.gguf" --check "$s2/ref.json"
