#!/bin/sh
# The King James Bible (public domain) as one verse a line, gzipped, from
# Debian's bible-kjv-text (the data) and bible-kjv (the reader):
#   apt-get install bible-kjv bible-kjv-text
#   tools/train/kjv.sh OUT.txt.gz
set -eu
out=${1:?usage: kjv.sh OUT.txt.gz}
command -v bible >/dev/null || { echo "kjv.sh: 'bible' not found; apt-get install bible-kjv bible-kjv-text" >&2; exit 1; }
bible -f "gen1:1-rev22:21" </dev/null | gzip -9n >"$out"
n=$(gzip -dc "$out" | wc -l)
[ "$n" -eq 31102 ] || { echo "kjv.sh: $n verses, expected 31102" >&2; exit 1; }
echo "kjv.sh: $n verses in $out"
