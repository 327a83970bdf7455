#!/bin/sh
# offload.store: file with a path a user gets wrong: in a missing directory,
# a directory, a device, someone's existing file (never truncated or
# removed). Each cell that cannot run names its store path; the run exits
# non-zero.
SIFT=$1
WORK=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
: >tiny.yaml # built-in defaults: the synthetic model, the full policy (the default config runs the shipped model's grid)
tiny="--config tiny.yaml --set harness.lengths=[256] --set harness.depths=[0.5] --set harness.decode_steps=2 --set kv.chunk_size=128"
n=0
run () # EXPECTED-STDERR-TEXT STORE-PATH
{
  n=$((n + 1))
  expect fail "$1" "$SIFT" needle $tiny --out "$WORK/out$n" --set offload.store=file --set "offload.path=$2"
}
run "file store $WORK/nodir/kv.store: cannot create: No such file or directory" "$WORK/nodir/kv.store"
mkdir adir
run "file store $WORK/adir: exists and is not a regular file" "$WORK/adir"
# A FIFO stands for a device: never /dev/null itself, which a store that
# took it would truncate and, as root, remove.
mkfifo fifo
run "file store $WORK/fifo: exists and is not a regular file" "$WORK/fifo"
[ -p fifo ] && echo "ok: fifo still there" || { echo "FAIL: fifo removed"; failures=$((failures + 1)); }
echo "a user's data" >mine.txt
run "file store $WORK/mine.txt: a file of 14 bytes is already there" "$WORK/mine.txt"
if [ "$(cat mine.txt)" = "a user's data" ]; then echo "ok: mine.txt intact"; else
  echo "FAIL: mine.txt was changed or removed"; failures=$((failures + 1)); fi
# An empty file is taken (and removed afterwards, as the store's own).
: >empty.kv
expect 0 "" "$SIFT" needle $tiny --out "$WORK/out-empty" --set offload.store=file --set "offload.path=$WORK/empty.kv"
if [ -e empty.kv ]; then echo "FAIL: empty.kv left behind"; failures=$((failures + 1)); fi
# With keep, a kept store is reused by the next run.
expect 0 "" "$SIFT" needle $tiny --out "$WORK/out-keep1" --set offload.store=file --set "offload.path=$WORK/kept.kv" \
  --set offload.keep=true
expect 0 "" "$SIFT" needle $tiny --out "$WORK/out-keep2" --set offload.store=file --set "offload.path=$WORK/kept.kv" \
  --set offload.keep=true
if [ "$(id -u)" -ne 0 ]; then
  mkdir ro && chmod 555 ro
  run "file store $WORK/ro/kv.store: cannot create: Permission denied" "$WORK/ro/kv.store"
  chmod 755 ro
fi
finish
