#!/bin/bash
# Stage 3, the fine-tune from v2, in ONE device command (at most 10
# minutes): train from v2's GGUF (train.py --init-gguf, --mix stage3,
# every length 1K-16K as likely, its own time budget: --time-budget
# --fit-budget end it decayed in time), then export and check the GGUF
# (ref.json, split in pieces of 15 MiB: the device tool returns files of at
# most 16 MiB; `cat gguf.part-* > model.gguf` joins them), evaluate on the
# card's samples (eval.json: seed 20260, EVAL_N a cell, every kind), and
# measure the new checkpoint and the GGUF it started from side by side on
# SIDE_N samples a cell (eval-new-side.json, eval-old-side.json).  Run from
# the repository root:
#   C=.carry-t20; T=$C/train KJV=$C/kjv.txt.gz INIT=v2.gguf bash $C/train/device_stage3.sh SECONDS
# (the shipped run: INIT=models/sift-needle-14m-f16.gguf, v2 then).
# STEPS, DECAY, LR, EVAL_N, SIDE_N and RESERVE (seconds kept for everything
# after training) tune it.  Everything comes back under $OUT.
limit=${1:?seconds}
. "$(dirname "$0")/device_env.sh"
INIT=${INIT:?INIT=the v2 GGUF to start from (reproduce.sh STAGE3=0 writes it; models/ held it until v3)}
STEPS=${STEPS:-8000}
DECAY=${DECAY:-3000}
LR=${LR:-3e-4}
EVAL_N=${EVAL_N:-20}
SIDE_N=${SIDE_N:-50}
RESERVE=${RESERVE:-170}
LENGTHS=1024,2048,4096,8192,16384
W=$(mktemp -d)
sha256sum "$INIT" | tee -a "$log"
budget=$((limit - SECONDS - RESERVE))
echo "training budget ${budget}s" | tee -a "$log"
python3 "$T/train.py" --kjv "$KJV" --tokenizer "$TOK" --out "$W/ckpt" --seed 1 \
  --init-gguf "$INIT" --mix stage3 --schedule 0:16384 --min-len 1024 --top-share 0.2 \
  --steps "$STEPS" --decay-steps "$DECAY" --lr "$LR" --warmup 200 \
  --time-budget "$budget" --fit-budget --workers 14 --ckpt-every 150 2>&1 | tee -a "$log" || exit 1
cp "$W/ckpt/meta.json" "$OUT/meta.json"
ev=(--kjv "$KJV" --tokenizer "$TOK" --lengths $LENGTHS)
python3 "$T/evaluate.py" --ckpt "$W/ckpt" "${ev[@]}" --ref-out "$OUT/ref.json" 2>&1 | tee -a "$log"
python3 "$T/export.py" --ckpt "$W/ckpt" --tokenizer "$TOK" --out "$W/model.gguf" --check "$OUT/ref.json" 2>&1 | tee -a "$log"
echo "export.py exit $?" | tee -a "$log"
sha256sum "$W/model.gguf" | tee -a "$log"
split -b 15M "$W/model.gguf" "$OUT/gguf.part-"
echo "$((limit - SECONDS)) s left for the evaluations" | tee -a "$log"
python3 "$T/evaluate.py" --ckpt "$W/ckpt" "${ev[@]}" --n "$EVAL_N" --eval-out "$OUT/eval.json" 2>&1 | tee -a "$log"
python3 "$T/evaluate.py" --ckpt "$W/ckpt" "${ev[@]}" --n "$SIDE_N" --eval-out "$OUT/eval-new-side.json" 2>&1 | tee -a "$log"
python3 "$T/evaluate.py" --gguf "$INIT" "${ev[@]}" --n "$SIDE_N" --eval-out "$OUT/eval-old-side.json" 2>&1 | tee -a "$log"
ls -la "$OUT" | tee -a "$log"
echo "done in ${SECONDS}s" | tee -a "$log"
