#!/bin/bash
# The plugin SDK end to end, as a user meets it (docs/writing-a-policy.md):
# installs this build into a temporary root, then builds a plugin from a
# folder outside the source tree with nothing but pkg-config, runs its
# test, and uses it from the installed `sift`.
#
#   sdk-test.sh MODE BUILD_ROOT SOURCE_ROOT MESON SANITIZE
#
# MODE  streaming  plugins/streaming copied out of tree: builds, its test
#                  passes, installs into policydir, `sift policies` and
#                  `sift config check` see it;
#       needle     the same plugin through `sift needle` on a small grid:
#                  from the JSON records, it passes the needles inside its
#                  sinks + window and fails those outside;
#       new        `sift policies new` writes a skeleton that builds and
#                  passes its own test.
# Exit 77 (skipped) only when a tool the test needs is absent.
set -euo pipefail

mode=$1 build=$2 src=$3 meson=$4 sanitize=${5:-none}

fail () { echo "FAIL: $*" >&2; exit 1; }
skip () { echo "SKIP: $*" >&2; exit 77; }
step () { echo "== $*"; }
for tool in pkg-config ninja cc; do
  command -v "$tool" > /dev/null || skip "$tool is not installed"
done
[ -x "$meson" ] || command -v "$meson" > /dev/null || skip "meson ($meson) is not installed"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sift-sdk-$mode.XXXXXX")
if [ -n "${SIFT_KEEP_TMP:-}" ]; then
  trap 'echo "kept $tmp" >&2' EXIT
else
  trap 'rm -rf "$tmp"' EXIT
fi

# Runs a command quietly, printing its output only when it fails.
quiet () {
  local log="$tmp/last.log"
  if ! "$@" > "$log" 2>&1; then
    cat "$log" >&2
    fail "$*"
  fi
}

# meson install --destdir of this build (no rebuild), then sift.pc's prefix
# moved to where the files are: the build's prefix is compiled in, so the
# root is a relocated copy, found only through PKG_CONFIG_PATH.
install_sift () {
  step "meson install --destdir $tmp/root"
  quiet "$meson" install -C "$build" --no-rebuild --destdir "$tmp/root"
  local pc
  pc=$(find "$tmp/root" -path '*/pkgconfig/sift.pc' | head -n 1)
  [ -n "$pc" ] || fail "meson install put no pkgconfig/sift.pc under $tmp/root"
  local prefix
  prefix=$(sed -n 's/^prefix=//p' "$pc")
  sed -i "s|^prefix=.*|prefix=$tmp/root$prefix|" "$pc"
  export PKG_CONFIG_PATH="$(dirname "$pc")"
  [ "$(pkg-config --variable=prefix sift)" = "$tmp/root$prefix" ] || fail "pkg-config does not find $pc"
  libdir=$(pkg-config --variable=libdir sift)
  includedir=$(pkg-config --variable=includedir sift)
  policydir=$(pkg-config --variable=policydir sift)
  configdir=$(pkg-config --variable=configdir sift)
  sift="$tmp/root$prefix/bin/sift"
  for f in "$includedir/sift/sift.h" "$includedir/sift/version.h" "$libdir/libsift.so" "$sift" \
           "$configdir/default.yaml"; do
    [ -e "$f" ] || fail "not installed: $f"
  done
  ls "$policydir"/*.so > /dev/null 2>&1 || fail "no policy installed in policydir $policydir"
  export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The installed sift sees the installed policies and what a step adds.
  export SIFT_POLICY_SYSTEM_PATH="$policydir"
  unset SIFT_POLICY_PATH
  unset SIFT_DEFAULT_CONFIG
}

# Sets up a plugin project in $1 (outside the source tree) with meson and
# runs its tests; only pkg-config tells it where sift is.
build_plugin () {
  local dir=$1
  local -a opts=()
  case "$sanitize" in
    address-undefined) opts+=(-Db_sanitize=address,undefined) ;;
    thread) opts+=(-Db_sanitize=thread) ;;
  esac
  step "meson setup + meson test in $dir"
  (cd "$dir" && quiet "$meson" setup build "${opts[@]}")
  # It compiles against the installed headers, not the source tree's.
  grep -q -- "-I$includedir" "$dir/build/compile_commands.json" \
    || fail "the plugin's build does not use the installed headers ($includedir)"
  if grep -q -- "$src/include" "$dir/build/compile_commands.json"; then
    fail "the plugin's build reaches into the source tree ($src/include)"
  fi
  # As the tutorial does: `meson test` alone must build what the test loads.
  quiet "$meson" test -C "$dir/build" --print-errorlogs
}

copy_streaming () {
  cp -r "$src/plugins/streaming" "$tmp/streaming"
  rm -rf "$tmp/streaming/build"
  build_plugin "$tmp/streaming"
}

# The sinks + window rule written out again, slow and obvious: is the
# token at `pos` attended by query rows starting at q_pos, when tokens
# before stored_end are in stored blocks? Blocks holding a sink token or
# reaching into [q_pos - window, q_pos) are kept; unstored tokens always are.
kept () {
  local pos=$1 q_pos=$2 stored_end=$3
  (( pos >= stored_end )) && return 0
  local first=$(( pos / block * block ))
  local end=$(( first + block < stored_end ? first + block : stored_end ))
  (( first < sinks || end > q_pos - window ))
}

run_needle () {
  block=64 chunk=128 sinks=4 window=192 length=768
  cat > "$tmp/streaming.yaml" <<YAML
model:
  source: synthetic
  layers: 2
  q_heads: 4
  kv_heads: 2
  head_dim: 64
kv:
  block_size: $block
  chunk_size: $chunk
policies:
  - label: full
    prefill: full
    decode: full
  - label: streaming
    prefill: {name: streaming, params: {sink_tokens: $sinks, window_tokens: $window}}
    decode: {name: streaming, params: {sink_tokens: $sinks, window_tokens: $window}}
harness:
  lengths: [$length]
  depths: [0.0, 0.25, 0.5, 0.9]
  decode_steps: 4
YAML
  step "sift needle on a ${length}-token grid"
  local rc=0
  SIFT_POLICY_PATH="$tmp/streaming/build" "$sift" needle --config "$tmp/streaming.yaml" --out "$tmp/out" \
    > "$tmp/needle.out" 2>&1 || rc=$?
  if (( rc != 0 )); then
    cat "$tmp/needle.out" >&2
    fail "sift needle exited $rc"
  fi
  local records="$tmp/out/records.jsonl"
  [ -s "$records" ] || fail "sift needle wrote no $records"
  ls "$tmp/out"/*streaming*.png > /dev/null 2>&1 || fail "no streaming heatmap (.png) in $tmp/out"

  local n_full=0 n_streaming=0 inside=0 outside=0 re
  while IFS= read -r line; do
    re='"label":"([a-z]+)"'; [[ $line =~ $re ]] || fail "record without a label: $line"
    local label=${BASH_REMATCH[1]}
    re='"length":([0-9]+)'; [[ $line =~ $re ]] || fail "record without a length: $line"
    local n=${BASH_REMATCH[1]}
    re='"positions":\[([0-9]+)'; [[ $line =~ $re ]] || fail "record without needle positions: $line"
    local pos=${BASH_REMATCH[1]}
    re='"prefill_pass":(true|false)'; [[ $line =~ $re ]] || fail "record without prefill_pass: $line"
    local prefill_pass=${BASH_REMATCH[1]}
    re='"decode_pass":(true|false)'; [[ $line =~ $re ]] || fail "record without decode_pass: $line"
    local decode_pass=${BASH_REMATCH[1]}
    if [ "$label" = full ]; then
      n_full=$((n_full + 1))
      [ "$prefill_pass $decode_pass" = "true true" ] || fail "full attention failed the needle at $pos of $n"
      continue
    fi
    [ "$label" = streaming ] || fail "unexpected setup '$label' in $records"
    n_streaming=$((n_streaming + 1))
    # Prefill: the question rows sit in the last chunk, whose tokens are
    # not stored yet. Decode: rows after the prompt; its whole blocks are stored.
    local last_chunk=$(( (n - 1) / chunk * chunk ))
    local want_prefill=false want_decode=false
    kept "$pos" "$last_chunk" "$last_chunk" && want_prefill=true
    kept "$pos" "$n" $(( n / block * block )) && want_decode=true
    echo "streaming: needle at $pos of $n: prefill $prefill_pass (want $want_prefill), decode $decode_pass (want $want_decode)"
    [ "$prefill_pass" = "$want_prefill" ] || fail "streaming prefill at needle $pos: $prefill_pass, want $want_prefill"
    [ "$decode_pass" = "$want_decode" ] || fail "streaming decode at needle $pos: $decode_pass, want $want_decode"
    [ "$want_prefill $want_decode" = "true true" ] && inside=$((inside + 1))
    [ "$want_prefill $want_decode" = "false false" ] && outside=$((outside + 1))
  done < "$records"
  (( n_full == 4 && n_streaming == 4 )) || fail "want 4 cells per setup, got full $n_full, streaming $n_streaming"
  # The grid must test both sides of the window.
  (( inside >= 1 && outside >= 1 )) || fail "grid has $inside needles inside the window and $outside outside"
}

case "$mode" in
  streaming)
    install_sift
    copy_streaming
    step "meson install of the plugin into policydir"
    quiet "$meson" install -C "$tmp/streaming/build"
    [ -e "$policydir/libstreaming.so" ] || [ -e "$policydir/streaming.so" ] \
      || fail "the plugin was not installed into policydir $policydir"
    step "sift policies info streaming (installed)"
    "$sift" policies info streaming > "$tmp/info.out" 2>&1 || { cat "$tmp/info.out" >&2; fail "sift policies info streaming"; }
    grep -q "file: *$policydir/" "$tmp/info.out" || { cat "$tmp/info.out" >&2; fail "streaming not loaded from policydir"; }
    grep -q "sink_tokens *int *4 " "$tmp/info.out" || { cat "$tmp/info.out" >&2; fail "sink_tokens (default 4) not listed"; }
    step "sift config check selects it from YAML"
    printf 'policy:\n  prefill: {name: streaming, params: {window_tokens: 256}}\n  decode: streaming\n' > "$tmp/select.yaml"
    "$sift" config check "$tmp/select.yaml" > "$tmp/check.out" 2>&1 || { cat "$tmp/check.out" >&2; fail "config check"; }
    grep -q "window_tokens: 256" "$tmp/check.out" || { cat "$tmp/check.out" >&2; fail "window_tokens not resolved"; }
    # The host validates params against the plugin's table.
    printf 'policy:\n  decode: {name: streaming, params: {window_tokens: -1}}\n' > "$tmp/bad.yaml"
    if "$sift" config check "$tmp/bad.yaml" > "$tmp/bad.out" 2>&1; then
      fail "config check accepted window_tokens: -1"
    fi
    grep -q "bad.yaml:2:" "$tmp/bad.out" || { cat "$tmp/bad.out" >&2; fail "the range error does not point at bad.yaml:2"; }
    ;;
  needle)
    install_sift
    copy_streaming
    run_needle
    ;;
  new)
    install_sift
    step "sift policies new my-policy"
    (cd "$tmp" && quiet "$sift" policies new my-policy)
    for f in my-policy.c test-my-policy.c meson.build meson_options.txt; do
      [ -s "$tmp/my-policy/$f" ] || fail "sift policies new wrote no $f"
    done
    if (cd "$tmp" && "$sift" policies new my-policy > "$tmp/again.out" 2>&1); then
      fail "sift policies new overwrote an existing folder"
    fi
    build_plugin "$tmp/my-policy"
    SIFT_POLICY_PATH="$tmp/my-policy/build" "$sift" policies info my-policy > "$tmp/info.out" 2>&1 \
      || { cat "$tmp/info.out" >&2; fail "sift policies info my-policy"; }
    # Its test can fail: drop the first block from the selection.
    sed -i 's/if (i == 0 || i >= first_recent)/if (i >= first_recent)/' "$tmp/my-policy/my-policy.c"
    grep -q 'if (i >= first_recent)' "$tmp/my-policy/my-policy.c" || fail "the skeleton's select_blocks changed; update this test"
    if "$meson" test -C "$tmp/my-policy/build" > "$tmp/broken.out" 2>&1; then
      fail "the skeleton's test passes a policy that breaks its rule"
    fi
    (cd "$tmp" && "$sift" policies new full > "$tmp/full.out" 2>&1) || { cat "$tmp/full.out" >&2; fail "sift policies new full"; }
    grep -q "warning: a policy named 'full' already exists ($policydir/" "$tmp/full.out" \
      || { cat "$tmp/full.out" >&2; fail "no warning for a name already on the search path"; }
    rc=0
    "$sift" policies new 2-bad > "$tmp/bad-name.out" 2>&1 || rc=$?
    (( rc == 2 )) || fail "sift policies new 2-bad exited $rc, want 2"
    grep -q "invalid policy name '2-bad'" "$tmp/bad-name.out" || fail "no clear message for an invalid name"
    ;;
  *)
    echo "usage: $0 streaming|needle|new BUILD_ROOT SOURCE_ROOT MESON [SANITIZE]" >&2
    exit 2
    ;;
esac
echo "ok: $mode"
