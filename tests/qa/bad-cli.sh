#!/bin/sh
# Command-line misuse: unknown policies, bad bench lengths, --out where it
# cannot write. Each exits non-zero with a message naming the value.
SIFT=$1
WORK=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
: >tiny.yaml # built-in defaults: the synthetic model, the full policy (the default config runs the shipped model)
tiny="--config tiny.yaml --set harness.lengths=[256] --set harness.depths=[0.5] --set harness.decode_steps=2 --set kv.chunk_size=128"
expect 2 "no policy named 'nosuch'" "$SIFT" policies info nosuch
expect 2 "Usage: sift policies" "$SIFT" policies info
expect 2 "Usage: sift policies" "$SIFT" policies bogus
expect 2 "Usage" "$SIFT" nosuchcommand
expect fail "0" "$SIFT" bench attention --lengths 0
expect fail "abc" "$SIFT" bench attention --lengths abc
echo data >afile
# shellcheck disable=SC2086
expect fail "$WORK/afile" "$SIFT" needle $tiny --out "$WORK/afile"
[ "$(cat afile)" = data ] && echo "ok: afile intact" || { echo "FAIL: afile changed"; failures=$((failures + 1)); }
# Output that cannot be written (a full disk) is an error, not a silent success.
if [ -c /dev/full ]; then
  : >c.yaml
  expect 3 "sift config: cannot write the output" sh -c "\"\$0\" config check c.yaml >/dev/full" "$SIFT"
  expect 3 "sift policies: cannot write the output" sh -c "\"\$0\" policies list >/dev/full" "$SIFT"
  expect 3 "sift policies: cannot write the output" sh -c "\"\$0\" policies info full >/dev/full" "$SIFT"
  expect 3 "sift version: cannot write the output" sh -c "\"\$0\" version >/dev/full" "$SIFT"
  # shellcheck disable=SC2086
  expect 3 "sift needle: cannot write the output" sh -c "\"\$0\" needle $tiny --out \"$WORK/o\" >/dev/full" "$SIFT"
fi
finish
