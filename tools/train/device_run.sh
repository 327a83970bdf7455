#!/bin/bash
# One segment of the shipped model's training on the GPU machine (through
# the device tool's run), from a folder holding tools/train/, kjv.txt.gz and,
# after the first segment, tokenizer.json and the last checkpoint in ckpt/:
#   device_run.sh first|more|last|stage2|stage2-more SECONDS
# Stage 1 (from scratch):
#   first: trains the tokenizer, runs selftest.py against transformers and
#          the BPE, then trains from scratch; more: resumes from ckpt/, then a
#          small evaluation (4 samples a cell: a check of the path); last:
#          resumes, then the full evaluation.  Both write eval.json and ref.json.
# Stage 2 (the multikey fine-tune, from stage 1's F16 GGUF):
#   stage2: checks the import of $STAGE1 (import_gguf.py: round trip, and
#           transformers' logits against $STAGE1_REF when given), trains
#           stage 2 from it into $OUT/ckpt, then the full evaluation;
#   stage2-more: resumes stage 2 from ckpt/, then the full evaluation.
# T (default: this script's folder), KJV (kjv.txt.gz), TOK (tokenizer.json)
# name the inputs; STEPS, TRAIN_ARGS, EVAL_ARGS, EVAL_SECONDS, WORKERS tune
# the run.
# Everything (log, checkpoint, tokenizer, results) goes to $OUT.
mode=${1:?first|more|last|stage2|stage2-more}
limit=${2:?seconds}
TOK0=${TOK:-}
LOG=train.log . "$(dirname "$0")/device_env.sh"
TOK=$TOK0
EVAL_SECONDS=${EVAL_SECONDS:-150}
out=$OUT
case $mode in
  first)
    STEPS=${STEPS:-12000}
    python3 $T/make_tokenizer.py --kjv "$KJV" --out "$OUT/tokenizer.json" 2>&1 | tee -a "$log" || exit 1
    python3 $T/selftest.py --kjv "$KJV" --tokenizer "$OUT/tokenizer.json" --skip-train 2>&1 | tee -a "$log"
    tokj=$OUT/tokenizer.json; start= ;;
  more|last)
    STEPS=${STEPS:-12000}
    tokj=${TOK:-tokenizer.json}; start="--resume ckpt" ;;
  stage2|stage2-more)
    # stage 2's recipe (as reproduce.sh runs it)
    STEPS=${STEPS:-4000}
    TRAIN_ARGS="--mix multikey --schedule 0:16384 --lr 3e-4 --warmup 200 --decay-steps $((STEPS - 200)) ${TRAIN_ARGS:-}"
    tokj=${TOK:-tokenizer.json}; out=$OUT/ckpt; mkdir -p "$out"
    if [ "$mode" = stage2 ]; then
      : "${STAGE1:?stage2 needs STAGE1=the stage-1 F16 GGUF}"
      python3 $T/import_gguf.py --gguf "$STAGE1" --tokenizer "$tokj" --roundtrip \
        ${STAGE1_REF:+--ref "$STAGE1_REF"} 2>&1 | tee -a "$log" \
        || echo "stage2: the import check failed (above); training goes on, its result is suspect" | tee -a "$log"
      start="--init-gguf $STAGE1"
    else
      start="--resume ckpt"
    fi ;;
  *) echo "device_run.sh: unknown mode $mode" >&2; exit 2 ;;
esac
budget=$((limit - SECONDS - 15))
[ "$mode" = first ] || budget=$((budget - EVAL_SECONDS))
echo "training budget ${budget}s" | tee -a "$log"
python3 $T/train.py --kjv "$KJV" --tokenizer "$tokj" --out "$out" $start \
  --steps "$STEPS" --time-budget "$budget" --workers "${WORKERS:-12}" --ckpt-every 90 ${TRAIN_ARGS:-} 2>&1 | tee -a "$log"
[ "$mode" = more ] && EVAL_ARGS=${EVAL_ARGS:-"--n 4 --lengths 2048,8192,16384"}
if [ "$mode" != first ]; then
  python3 $T/evaluate.py --ckpt "$out" --kjv "$KJV" --tokenizer "$tokj" \
    --ref-out "$OUT/ref.json" --eval-out "$OUT/eval.json" ${EVAL_ARGS:-} 2>&1 | tee -a "$log"
fi
ls -laR "$OUT" | tee -a "$log"
