#!/bin/sh
# sift model info and sift generate on tiny random GGUF models.
# Usage: cli.sh SIFT SIFT_MAKE_GGUF
set -eu
sift=$1
make=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail () { echo "FAIL: $*" >&2; exit 1; }

"$make" --arch qwen3 --type Q4_K --seed 3 "$dir/q3.gguf"
"$sift" model info "$dir/q3.gguf" > "$dir/info.txt"
grep -q '^architecture  qwen3$' "$dir/info.txt" || fail "architecture"
grep -q '^  Q4_K ' "$dir/info.txt" || fail "tensor types"
grep -q '^tokenizer     gpt2 (pre-tokenizer qwen2), 384 tokens' "$dir/info.txt" || fail "tokenizer"
grep -q '^shape         2 layers, 256 wide, 4 heads (2 kv) of 64, FFN 512, vocab 384$' "$dir/info.txt" || fail "shape"
grep -q '^context       4096 tokens$' "$dir/info.txt" || fail "context"
grep -q '^runnable      yes$' "$dir/info.txt" || fail "runnable"

# A truncated file: an error naming the file, exit status 3.
head -c 1000 "$dir/q3.gguf" > "$dir/cut.gguf"
status=0
"$sift" model info "$dir/cut.gguf" > /dev/null 2> "$dir/err.txt" || status=$?
[ "$status" = 3 ] || fail "truncated file: exit $status"
grep -q "cut.gguf" "$dir/err.txt" || fail "truncated file: message $(cat "$dir/err.txt")"

# An architecture sift does not run: described, then refused with the supported list.
"$make" --arch mamba --type F32 "$dir/mamba.gguf"
status=0
"$sift" model info "$dir/mamba.gguf" > "$dir/info.txt" 2> "$dir/err.txt" || status=$?
[ "$status" = 3 ] || fail "mamba: exit $status"
grep -q '^runnable      no$' "$dir/info.txt" || fail "mamba: runnable"
grep -q 'llama, qwen2, qwen3' "$dir/err.txt" || fail "mamba: message"
# A config for the file that states another shape: exit 2, both values named.
"$make" --arch llama --type F32 --seed 4 "$dir/l.gguf"
printf 'model:\n  source: gguf\n  path: %s\n  layers: 3\n' "$dir/l.gguf" > "$dir/bad.yaml"
status=0
"$sift" generate --config "$dir/bad.yaml" --tokens 1,2,3 -n 1 > /dev/null 2> "$dir/err.txt" || status=$?
[ "$status" = 2 ] || fail "contradicting shape: exit $status"
grep -q 'bad.yaml:4:11: model.layers is 3 but .*l.gguf has 2 layers' "$dir/err.txt" || fail "contradicting shape: message $(cat "$dir/err.txt")"
printf 'model:\n  source: gguf\n  path: %s\n  kv_heads: 4\n' "$dir/l.gguf" > "$dir/bad.yaml"
status=0
"$sift" generate --config "$dir/bad.yaml" --tokens 1,2,3 -n 1 > /dev/null 2> "$dir/err.txt" || status=$?
[ "$status" = 2 ] || fail "contradicting kv heads: exit $status"
grep -q 'model.kv_heads is 4 but .*l.gguf has 2 kv heads' "$dir/err.txt" || fail "contradicting kv heads: message $(cat "$dir/err.txt")"
# The same keys saying what the file says: it runs.
printf 'model:\n  source: gguf\n  path: %s\n  layers: 2\n  kv_heads: 2\n' "$dir/l.gguf" > "$dir/good.yaml"
"$sift" generate --config "$dir/good.yaml" --tokens 1,2,3 -n 2 > "$dir/out.txt" || fail "matching shape: exit $?"
grep -q '^tokens  ' "$dir/out.txt" || fail "matching shape: output"
echo ok
