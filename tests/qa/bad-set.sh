#!/bin/sh
# --set garbage: each assignment is refused pointing into it, exit 2.
SIFT=$1
WORK=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
: >c.yaml
s () { expect 2 "$2" "$SIFT" config check c.yaml --set "$1"; }
s '' "--set:1:1: expected KEY=VALUE"
s '=' "--set:1:1: expected KEY=VALUE"
s 'kv.block_size' "expected KEY=VALUE"
s 'kv.block_size=' "--set:1:15: no value after '='"
s 'kv.block_size=abc' "--set:1:15: kv.block_size: expected an integer, got 'abc'"
s 'kv..block_size=1' "has an empty component"
s 'kv=1' "kv: expected a mapping, got a scalar"
s 'kv.block_size.x=1' "kv.block_size is not a section"
s 'nosuch.x=1' "unknown section 'nosuch'"
s 'kv.block_size=[1' "invalid YAML"
s 'kv.block_size=99999999999999999999' "kv.block_size: 99999999999999999999 is out of range"
s 'policy.decode.params.nosuch=1' "undeclared parameter 'nosuch'"
s 'policies.nolabel.decode=full' "no setup labelled 'nolabel'"
s 'policies=[]' "the list is empty"
s 'policy.decode=nosuch' "no policy named 'nosuch'"
s 'harness.lengths=[]' "harness.lengths is empty"
s "$(printf 'kv.block_size=1\377')" "--set:1:16: invalid YAML: invalid leading UTF-8 octet"
# Policy parameters: a number too large is out of range, not of the wrong type.
GOOD_DIR=$3
p () { SIFT_POLICY_PATH="$GOOD_DIR:$SIFT_POLICY_PATH" expect 2 "$2" "$SIFT" config check c.yaml --set policy.decode=good --set "$1"; }
p 'policy.decode.params.stride=99999999999999999999' "parameter 'stride' = 99999999999999999999 is out of range [1, 64]"
p 'policy.decode.params.ratio=1e999' "parameter 'ratio' = 1e999 is out of range"
p 'policy.decode.params.stride=abc' "parameter 'stride' expects an integer, got 'abc'"
finish
