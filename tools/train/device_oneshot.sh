#!/bin/bash
# Stage 1 from scratch in ONE device command (at most 10 minutes), with the
# tokenizer kept (models/tokenizer.json: the GGUF vocabulary stays the same):
# train (its own time budget: --time-budget/--fit-budget end it decayed in
# time), evaluate (eval.json, ref.json), export and check the GGUF, and
# measure the previously shipped GGUF's multikey cells on the same samples
# (eval-old.json).  Run from the repository root:
#   T=.carry-k20/train KJV=.carry-k20/kjv.txt.gz bash $T/device_oneshot.sh SECONDS
# STEPS, SCHEDULE, DECAY, EVAL_N, RESERVE (seconds kept for everything after
# training), OLD (the GGUF to compare with) tune it.  Everything comes back
# under $OUT: log.txt, meta.json, eval.json, ref.json, eval-old.json and the
# GGUF split in pieces of 15 MiB (gguf.part-aa, -ab: the device tool returns
# files of at most 16 MiB; `cat gguf.part-* > model.gguf` joins them).
limit=${1:?seconds}
. "$(dirname "$0")/device_env.sh"
OLD=${OLD:-models/sift-needle-14m-f16.gguf}
STEPS=${STEPS:-7000}
DECAY=${DECAY:-2000}
SCHEDULE=${SCHEDULE:-0:512,400:1024,1000:2048,2000:4096,3200:8192,4500:16384}
EVAL_N=${EVAL_N:-20}
RESERVE=${RESERVE:-90}
LENGTHS=1024,2048,4096,8192,16384
W=$(mktemp -d)
budget=$((limit - SECONDS - RESERVE))
echo "training budget ${budget}s" | tee -a "$log"
python3 "$T/train.py" --kjv "$KJV" --tokenizer "$TOK" --out "$W/ckpt" --seed 1 \
  --steps "$STEPS" --decay-steps "$DECAY" --warmup 300 --schedule "$SCHEDULE" \
  --time-budget "$budget" --fit-budget --workers 12 --ckpt-every 150 2>&1 | tee -a "$log" || exit 1
cp "$W/ckpt/meta.json" "$OUT/meta.json"
python3 "$T/evaluate.py" --ckpt "$W/ckpt" --kjv "$KJV" --tokenizer "$TOK" --n "$EVAL_N" --lengths $LENGTHS \
  --ref-out "$OUT/ref.json" --eval-out "$OUT/eval.json" 2>&1 | tee -a "$log"
python3 "$T/export.py" --ckpt "$W/ckpt" --tokenizer "$TOK" --out "$W/model.gguf" --check "$OUT/ref.json" 2>&1 | tee -a "$log"
echo "export.py exit $?" | tee -a "$log"
sha256sum "$W/model.gguf" | tee -a "$log"
split -b 15M "$W/model.gguf" "$OUT/gguf.part-"
echo "remaining $((limit - SECONDS)) s for the old model's multikey cells" | tee -a "$log"
python3 "$T/evaluate.py" --gguf "$OLD" --kjv "$KJV" --tokenizer "$TOK" --n "$EVAL_N" --lengths $LENGTHS \
  --kinds multikey --eval-out "$OUT/eval-old.json" 2>&1 | tee -a "$log"
ls -la "$OUT" | tee -a "$log"
echo "done in ${SECONDS}s" | tee -a "$log"
