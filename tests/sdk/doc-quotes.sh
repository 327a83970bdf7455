#!/bin/bash
# Code the tutorial quotes must be the example's code, character for
# character: every fenced block right after a marker line
#   <!-- quote: plugins/streaming/streaming.c -->
# must appear verbatim (as consecutive whole lines) in that file. For each
# WHOLE file, its quotes in order, joined by one blank line, must be the
# entire file: a reader can rebuild it from the tutorial alone.
#
#   doc-quotes.sh DOC SOURCE_ROOT [WHOLE...]
set -euo pipefail
doc=$1 root=$2
shift 2
[ -f "$doc" ] || { echo "FAIL: no $doc" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sift-quotes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Split the quoted blocks into files: tmp/N.src names the quoted file,
# tmp/N.block holds the block's lines.
awk -v dir="$tmp" '
  /^<!-- quote: [^ ]+ -->$/ { file = $3; next }
  file != "" && !inside && /^```/ { inside = 1; n++; print file > (dir "/" n ".src"); close (dir "/" n ".src");
                                    printf "" > (dir "/" n ".block"); next }
  inside && /^```$/ { inside = 0; file = ""; close (dir "/" n ".block"); next }
  inside { print >> (dir "/" n ".block"); next }
  file != "" && !/^$/ { print FILENAME ":" FNR ": a quote marker must be followed by a fenced block" > "/dev/stderr"; exit 1 }
' "$doc"

n=0 bad=0
while [ -e "$tmp/$((n + 1)).src" ]; do
  n=$((n + 1))
  src="$tmp/$n.src"
  block=${src%.src}.block
  file="$root/$(cat "$src")"
  [ -f "$file" ] || { echo "FAIL: quoted file $(cat "$src") does not exist" >&2; bad=1; continue; }
  [ -s "$block" ] || { echo "FAIL: an empty quote of $(cat "$src")" >&2; bad=1; continue; }
  # Whole lines, consecutive, in order: the block as one string must occur
  # in the file as one string, starting at a line start.
  if ! awk -v blockfile="$block" '
        BEGIN { RS = "^$"; getline want < blockfile; close (blockfile) }
        { text = "\n" $0 }
        END { exit index (text, "\n" want) ? 0 : 1 }' "$file"; then
    echo "FAIL: this block of $doc is not verbatim in $(cat "$src"):" >&2
    sed 's/^/  | /' "$block" >&2
    bad=1
  fi
done
for whole in "$@"; do
  joined="$tmp/whole"
  : > "$joined"
  first=1
  for (( i = 1; i <= n; i++ )); do
    src="$tmp/$i.src"
    [ "$(cat "$src")" = "$whole" ] || continue
    (( first )) || echo >> "$joined"
    cat "${src%.src}.block" >> "$joined"
    first=0
  done
  if ! cmp -s "$joined" "$root/$whole"; then
    echo "FAIL: the quotes of $whole in $doc, joined by blank lines, are not the whole file:" >&2
    diff "$joined" "$root/$whole" >&2 || true
    bad=1
  fi
done
# A tutorial that quotes nothing checks nothing.
(( n >= 4 )) || { echo "FAIL: only $n quoted blocks in $doc (markers: <!-- quote: FILE -->)" >&2; exit 1; }
(( bad == 0 )) || exit 1
echo "ok: $n quoted blocks verbatim"
