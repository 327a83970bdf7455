#!/bin/sh
# Sets up sift from scratch on Debian 12 (as root): installs the build
# dependencies with apt-get when any is missing, builds with meson into
# build/, then runs the main job (`run`, the default) or the whole test
# suite (`test`). Extra arguments after `run` go to `sift needle`.
set -eu
cd "$(dirname "$0")/.."

# bible-kjv and bible-kjv-text: the King James Bible, the default haystack of
# real-text needles (docs/needle.md).
packages="gcc libc6-dev meson ninja-build pkg-config libglib2.0-dev libyaml-dev libcmocka-dev libcairo2-dev liburing-dev bible-kjv bible-kjv-text"
if ! dpkg -s $packages >/dev/null 2>&1; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages
fi

[ -f build/build.ninja ] || meson setup build
meson compile -C build

mode=${1:-run}
[ $# -gt 0 ] && shift
case "$mode" in
  run)  exec ./build/tools/sift needle "$@" ;;
  test)
    status=0
    meson test -C build --print-errorlogs "$@" || status=$?
    # The plain closing line CI reads: counted from meson's own log
    # (python3 is there: meson runs on it).
    python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
results = [json.loads(line)["result"] for line in open(sys.argv[1]) if line.strip()]
ok = sum(r in ("OK", "EXPECTEDFAIL") for r in results)
skipped = sum(r == "SKIP" for r in results)
failed = len(results) - ok - skipped
print(f"{ok} passed, {failed} failed, {skipped} skipped")
PY
    exit $status ;;
  *)    echo "usage: $0 [run|test]" >&2; exit 2 ;;
esac
