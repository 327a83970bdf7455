#!/bin/sh
# Broken YAML files as a user writes them: each is refused with file:line:col
# (or the file's name) and exit 2.
SIFT=$1
WORK=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1

check () # NAME PRINTF-TEXT EXPECTED-STDERR-TEXT
{
  printf -- "$2" >"$1.yaml"
  expect 2 "$3" "$SIFT" config check "$1.yaml"
}
check syntax 'kv:\n  block_size: [1, 2\n' "syntax.yaml:2:20: invalid YAML"
check tab 'kv:\n\tblock_size: 64\n' "tab.yaml:2:1: invalid YAML"
check type 'model:\n  layers: two\n' "type.yaml:2:11: model.layers: expected an integer, got 'two'"
check unknown 'kv:\n  blok_size: 64\n' "did you mean 'block_size'?"
check huge-int 'model:\n  layers: 99999999999999999999999\n' \
  "huge-int.yaml:2:11: model.layers: 99999999999999999999999 is out of range [1, 4096]"
check huge-float 'model:\n  scale: 1e400\n' "huge-float.yaml:2:10: model.scale: 1e400 is out of range"
check negative 'kv:\n  block_size: -64\n' "negative.yaml:2:15: kv.block_size: -64 is out of range"
check negative-length 'harness:\n  lengths: [-5]\n' "harness.lengths[0]: -5 is out of range"
check seed 'model:\n  seed: -1\n' "model.seed: expected a non-negative integer, got '-1'"
check non-utf8 'kv:\n  block_size: \377\376\n' "non-utf8.yaml:2:15: invalid YAML: invalid leading UTF-8 octet"
check nul 'kv:\n  block_size: 64\000\n' "nul.yaml:2:17: contains a NUL byte"
check scalar 'hello\n' "scalar.yaml:1:1: the top level must be a mapping"
check list '- a\n- b\n' "got a list"
check null-value 'kv:\n  block_size:\n' "kv.block_size: expected an integer, got nothing"
check two-docs 'kv: {}\n---\nmodel: {}\n' "only one YAML document per config"
# Deep nesting: refused at once (libyaml alone takes minutes on this), and
# the quoted line is cut around the column instead of printed whole.
awk 'BEGIN { printf "harness:\n  lengths: "; for (i = 0; i < 200000; i++) printf "["; for (i = 0; i < 200000; i++) printf "]"; print "" }' >deep.yaml
expect 2 "deep.yaml:2:74: nested deeper than 64 levels" "$SIFT" config check deep.yaml
[ "$(wc -c <"$WORK/stderr")" -lt 1000 ] && echo "ok: short quote" || { echo "FAIL: the whole line quoted"; failures=$((failures + 1)); }
# Many parameters: checked in linear time (50000 took a minute when each
# name was compared with every earlier one).
awk 'BEGIN { print "policy:\n  decode:\n    name: full\n    params:"; for (i = 0; i < 50000; i++) printf "      p%d: 1\n", i }' >many.yaml
start=$(date +%s)
expect 2 "many.yaml:5:7: policy.decode.params.p0: policy 'full': undeclared parameter 'p0'" "$SIFT" config check many.yaml
[ $(($(date +%s) - start)) -lt 10 ] && echo "ok: many parameters quickly" || { echo "FAIL: many parameters slow"; failures=$((failures + 1)); }
awk 'BEGIN { print "policies:"; for (i = 0; i < 20000; i++) printf "  - label: s%d\n", i; print "  - label: s7" }' >setups.yaml
start=$(date +%s)
expect 2 "two setups are labelled 's7'" "$SIFT" config check setups.yaml
[ $(($(date +%s) - start)) -lt 10 ] && echo "ok: many setups quickly" || { echo "FAIL: many setups slow"; failures=$((failures + 1)); }
mkdir adir
expect 2 "adir: cannot read" "$SIFT" config check adir
expect 2 "nosuch.yaml: cannot read" "$SIFT" config check nosuch.yaml
# An empty file and one of comments only are the defaults.
# offload.device: an unknown device; cuda with a dtype or a policy the GPU
# cannot run (or, built without CUDA, cuda at all) names offload.device.
check device 'offload:\n  device: gpu\n' "device.yaml:2:11: offload.device: 'gpu' is not one of cpu | cuda"
check device-f32 'offload:\n  device: cuda\n' "device-f32.yaml:2:11: offload.device cuda"
check device-policy 'kv:\n  compute_dtype: bf16\nmodel:\n  head_dim: 64\noffload:\n  device: cuda\npolicy:\n  prefill: minference\n' "offload.device cuda"
: >empty.yaml
expect 0 "" "$SIFT" config check empty.yaml
printf '# nothing\n' >comment.yaml
expect 0 "" "$SIFT" config check comment.yaml
finish
