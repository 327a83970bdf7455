#!/bin/bash
# One segment of the shipped model's training on the GPU machine (through
# the device tool's run), from a folder holding tools/train/, kjv.txt.gz and,
# after the first segment, tokenizer.json and the last checkpoint in ckpt/:
#   device_run.sh first|more|last SECONDS
# first: trains the tokenizer, runs selftest.py against transformers and the
#        BPE, then trains from scratch; more: resumes from ckpt/, then a
#        small evaluation (4 samples a cell: a check of the path); last:
#        resumes, then the full evaluation.  Both write eval.json and ref.json.
# Everything (log, checkpoint, tokenizer, results) goes to $OUT.
set -o pipefail
mode=${1:?first|more|last}
limit=${2:?seconds}
: "${OUT:?}"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-12000}
EVAL_SECONDS=${EVAL_SECONDS:-150}
T=tools/train
log=$OUT/train.log
nvidia-smi -L | tee -a "$log"
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' | tee -a "$log"
if [ "$mode" = first ]; then
  python3 $T/make_tokenizer.py --kjv kjv.txt.gz --out "$OUT/tokenizer.json" 2>&1 | tee -a "$log" || exit 1
  python3 $T/selftest.py --kjv kjv.txt.gz --tokenizer "$OUT/tokenizer.json" --skip-train 2>&1 | tee -a "$log"
  tokj=$OUT/tokenizer.json; resume=
else
  tokj=tokenizer.json; resume="--resume ckpt"
fi
budget=$((limit - SECONDS - 15))
[ "$mode" = first ] || budget=$((budget - EVAL_SECONDS))
echo "training budget ${budget}s" | tee -a "$log"
python3 $T/train.py --kjv kjv.txt.gz --tokenizer "$tokj" --out "$OUT" $resume \
  --steps "$STEPS" --time-budget "$budget" --workers 12 --ckpt-every 90 ${TRAIN_ARGS:-} 2>&1 | tee -a "$log"
[ "$mode" = more ] && EVAL_ARGS=${EVAL_ARGS:-"--n 4 --lengths 2048,8192,16384"}
if [ "$mode" != first ]; then
  python3 $T/evaluate.py --ckpt "$OUT" --kjv kjv.txt.gz --tokenizer "$tokj" \
    --ref-out "$OUT/ref.json" --eval-out "$OUT/eval.json" ${EVAL_ARGS:-} 2>&1 | tee -a "$log"
fi
ls -la "$OUT" | tee -a "$log"
