#!/bin/sh
# Impossible shapes: refused at config time with the key that made them so,
# never an abort or an OOM kill. The memory figures are far above any
# machine (petabytes), so the checks hold everywhere.
SIFT=$1
WORK=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
: >c.yaml
expect 2 "model.head_dim: 0 is out of range" "$SIFT" config check c.yaml --set model.head_dim=0
expect 2 "model.kv_heads = 16 does not divide model.q_heads = 8" "$SIFT" config check c.yaml --set model.kv_heads=16
expect 2 "model.layers: -1 is out of range" "$SIFT" config check c.yaml --set model.layers=-1
huge="--set model.layers=4096 --set model.q_heads=4096 --set model.kv_heads=4096 --set model.head_dim=4096"
# shellcheck disable=SC2086
expect 2 "--set:1:16: this config needs about" "$SIFT" config check c.yaml $huge
# shellcheck disable=SC2086
expect 2 "more than this machine's" "$SIFT" needle --out "$WORK/out" $huge
expect 2 "of KV in the host store for 1000000000000 tokens" "$SIFT" needle --out "$WORK/out" \
  --set 'harness.lengths=[1000000000000]'
expect 2 "kv.block_size=65536" "$SIFT" config check c.yaml --set kv.chunk_size=16777216 --set kv.block_size=65536
# Needle groups the planner cannot place are refused where they are written.
expect 2 "--set:1:23: harness.n_distractors: 1000 is out of range [0, 64]" \
  "$SIFT" config check c.yaml --set harness.n_distractors=1000
# The same long context with the KV in a file is not refused for memory.
printf 'offload:\n  store: file\nharness:\n  lengths: [1000000000000]\n' >file.yaml
expect 0 "" "$SIFT" config check file.yaml
finish
