#!/bin/sh
# Broken modules on SIFT_POLICY_PATH: a truncated copy of a real policy, an
# empty file and a directory named like a module. None may crash a listing
# or a lookup; the broken one is named with its reason.
SIFT=$1 FULL_SO=$2
WORK=$(mktemp -d)
. "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
export SIFT_POLICY_SYSTEM_PATH=
mkdir -p trunc empty dir/x.so
size=$(wc -c <"$FULL_SO")
# Cut inside the loaded segments: the loader would map past the end (SIGBUS).
head -c $((size / 2)) "$FULL_SO" >trunc/libfull.so
head -c 64 "$FULL_SO" >trunc/libtiny.so
: >empty/x.so
: >c.yaml

SIFT_POLICY_PATH=$WORK/trunc expect 2 "trunc/libfull.so: cannot open: truncated or corrupt shared object" \
  "$SIFT" policies info full
SIFT_POLICY_PATH=$WORK/trunc expect 2 "trunc/libtiny.so: cannot open" "$SIFT" policies info tiny
SIFT_POLICY_PATH=$WORK/trunc expect 0 "trunc/libfull.so: cannot open" "$SIFT" policies list
SIFT_POLICY_PATH=$WORK/trunc expect 2 "policy 'full' cannot be loaded" "$SIFT" config check c.yaml
SIFT_POLICY_PATH=$WORK/empty expect 2 "empty/x.so: cannot open" "$SIFT" policies info x
SIFT_POLICY_PATH=$WORK/empty expect 0 "empty/x.so: cannot open" "$SIFT" policies list
SIFT_POLICY_PATH=$WORK/empty:$(dirname "$FULL_SO") expect 2 "--set:1:15: policy.decode: policy 'x' cannot be loaded" \
  "$SIFT" config check c.yaml --set policy.decode=x
SIFT_POLICY_PATH=$WORK/dir expect 2 "no policy named 'x'" "$SIFT" policies info x
SIFT_POLICY_PATH=$WORK/dir expect 2 "no policy named 'nosuch'" "$SIFT" policies info nosuch
finish
